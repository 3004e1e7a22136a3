"""Where escalations go: a generic webhook, a Slack-compatible webhook, e-mail, the terminal.

Every channel satisfies :class:`Channel`: ``send`` returns once the channel *accepted* the
notice (a 2xx answer, an SMTP server that took the message, a line written and flushed) and
raises :class:`ChannelError` otherwise. Channels don't retry; the service does, with backoff.

Every notice carries its idempotency key, ``<job>:<escalation id>`` (``Idempotency-Key`` and
``X-Dispatch-Escalation-Id`` headers on HTTP, a ``Message-ID`` derived from it on e-mail), so a
receiver can drop the copy a retry sends after an ambiguous failure: delivery is at least
once.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import smtplib
import ssl
import sys
from collections.abc import Mapping
from datetime import datetime
from email.message import EmailMessage
from email.utils import format_datetime
from pathlib import Path
from typing import Final, Literal, Protocol, TextIO, assert_never

import aiohttp
import msgspec
from yarl import URL

from dispatch_core.escalations import escalation_info
from services.notifier.config import (
    ChannelSpec,
    EmailSpec,
    SlackSpec,
    TerminalSpec,
    WebhookSpec,
)
from services.notifier.errors import ChannelError
from services.notifier.routing import HELD_NOTICE, Severity

__all__ = [
    "Channel",
    "ChannelError",
    "EmailChannel",
    "Notice",
    "SlackChannel",
    "TerminalChannel",
    "WebhookChannel",
    "build_channel",
]

USER_AGENT: Final = "dispatch-notifier/1"
_HELD_HINT: Final = (
    "The job is held and waits for a person (a notice, not an escalation). A person's "
    "hold: release it. A recovery hold: resubmit, cancel or give up."
)


NoticeKind = Literal["escalation", "notice"]
"""What a :class:`Notice` carries: an escalation of the record, or a notice that is not one."""


class Notice(msgspec.Struct, frozen=True, kw_only=True):
    """One escalation, as channels show it."""

    job_id: str
    id: str
    """The escalation's id (``failed:preempted``, ``overdue:3``, ...)."""
    detail: str
    at: datetime
    """When it was committed."""
    severity: Severity
    link: str | None = None
    """The job in dispatch's JSON API (``<api>/v1/jobs/<job>``), when its URL is configured:
    for programs (the webhook's ``link``); a browser gets 401 there."""
    kind: NoticeKind = "escalation"
    """``escalation`` (in the record, answered by its id) or ``notice`` (a status change the
    on-call is told of, e.g. ``held:<instance>``; nothing is recorded)."""
    page: str | None = None
    """The job on the API's web page (``<api>/#/job/<job>``), when its URL is configured: the
    link people are given."""

    @property
    def label(self) -> str:
        """``ESCALATION`` or ``NOTICE``: what a person reading one line is told it is."""
        return "NOTICE" if self.kind == "notice" else "ESCALATION"

    @property
    def open_link(self) -> str | None:
        """The link a person follows: the web page, else the API URL."""
        return self.page or self.link

    @property
    def key(self) -> str:
        """The idempotency key: unique per escalation, the same on every retry."""
        return f"{self.job_id}:{self.id}"

    @property
    def hint(self) -> str:
        """What a person can do about it (seed 002), or empty."""
        info = escalation_info(self.id)
        if info is not None:
            hint = info.advice
        elif self.id.startswith(f"{HELD_NOTICE}:"):
            hint = _HELD_HINT
        else:
            return ""
        return hint.replace("<job>", self.job_id)

    def headline(self) -> str:
        """One line: severity, job, id, detail."""
        detail = " ".join(self.detail.split())
        return f"[{self.severity}] dispatch job {self.job_id}: {self.id}: {detail}"


class WebhookBody(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The generic webhook's JSON body."""

    job: str
    id: str
    detail: str
    at: datetime
    severity: Severity
    key: str
    link: str | None = None
    kind: NoticeKind = "escalation"
    """Omitted for an escalation; ``notice`` for a notice that is not one (``held:*``)."""
    page: str | None = None
    """The job on the API's web page, for a person (``link`` stays the JSON API URL)."""


class Channel(Protocol):
    """A place escalations go."""

    @property
    def name(self) -> str:
        """The channel's name in routes, metrics and the record (``webhook``, ``oncall``)."""
        ...

    async def send(self, notice: Notice) -> None:
        """Hand ``notice`` over; return once the channel accepted it.

        Raises:
            ChannelError: it was not accepted (or may not have been: a timeout).
        """
        ...


def _key_headers(notice: Notice) -> dict[str, str]:
    return {
        "User-Agent": USER_AGENT,
        "Idempotency-Key": notice.key,
        "X-Dispatch-Escalation-Id": notice.id,
        "X-Dispatch-Job": notice.job_id,
    }


async def _post(
    session: aiohttp.ClientSession,
    name: str,
    url: str,
    body: bytes,
    headers: Mapping[str, str],
    timeout_s: float,
) -> None:
    """POST ``body``; return on 2xx, raise :class:`ChannelError` otherwise."""
    try:
        async with session.post(
            url,
            data=body,
            headers={"Content-Type": "application/json", **headers},
            timeout=aiohttp.ClientTimeout(total=timeout_s),
            allow_redirects=False,
        ) as resp:
            if 200 <= resp.status < 300:
                return
            text = (await resp.text(errors="replace"))[:200]
            retryable = resp.status >= 500 or resp.status in (408, 425, 429)
            raise ChannelError(
                name,
                f"HTTP {resp.status} from {_origin(url)}: {text!r}",
                outcome="failed" if retryable else "rejected",
                retry_after_s=_retry_after(resp.headers.get("Retry-After")),
            )
    except TimeoutError as err:
        raise ChannelError(name, f"no answer from {_origin(url)} within {timeout_s}s") from err
    except aiohttp.InvalidURL as err:  # its message holds the whole URL: a Slack secret
        raise ChannelError(name, "invalid URL", outcome="rejected") from err
    except aiohttp.ClientError as err:
        raise ChannelError(name, f"POST to {_origin(url)} failed: {err!r}") from err


def _origin(url: str) -> str:
    """The URL's scheme and host, never its path (a Slack URL's path is its secret)."""
    try:
        u = URL(url)
    except ValueError:
        return "<bad url>"
    return f"{u.scheme}://{u.host}:{u.port}" if u.host else "<bad url>"


def _retry_after(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None  # an HTTP date: rare from webhook receivers; backoff applies
    return seconds if seconds >= 0 else None


class WebhookChannel:
    """A generic webhook: POST a JSON :class:`WebhookBody`, optionally HMAC-signed."""

    def __init__(self, name: str, spec: WebhookSpec, session: aiohttp.ClientSession) -> None:
        """Post to ``spec.url`` through ``session`` (owned by the service)."""
        self._name, self._spec, self._session = name, spec, session

    @property
    def name(self) -> str:
        """The channel's name."""
        return self._name

    def body(self, notice: Notice) -> bytes:
        """Return the JSON body for ``notice``."""
        return msgspec.json.encode(
            WebhookBody(
                job=notice.job_id,
                id=notice.id,
                detail=notice.detail,
                at=notice.at,
                severity=notice.severity,
                key=notice.key,
                link=notice.link,
                kind=notice.kind,
                page=notice.page,
            )
        )

    async def send(self, notice: Notice) -> None:
        """POST the notice.

        Raises:
            ChannelError: not a 2xx answer, a timeout or a connection error.
        """
        body = self.body(notice)
        headers = {**self._spec.headers, **_key_headers(notice)}
        if self._spec.secret:
            digest = hmac.new(self._spec.secret.encode(), body, hashlib.sha256).hexdigest()
            headers["X-Dispatch-Signature"] = f"sha256={digest}"
        await _post(self._session, self._name, self._spec.url, body, headers, self._spec.timeout_s)


def _slack_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class SlackChannel:
    """A Slack-compatible incoming webhook: ``{"text": ...}``, with ``blocks`` if asked."""

    def __init__(self, name: str, spec: SlackSpec, session: aiohttp.ClientSession) -> None:
        """Post to ``spec.url`` through ``session`` (owned by the service)."""
        self._name, self._spec, self._session = name, spec, session

    @property
    def name(self) -> str:
        """The channel's name."""
        return self._name

    def payload(self, notice: Notice) -> dict[str, object]:
        """Return the Slack message for ``notice``."""
        job = _slack_escape(notice.job_id)
        detail = _slack_escape(notice.detail)
        title = f"dispatch job *{job}*: `{_slack_escape(notice.id)}` ({notice.severity})"
        link = f" <{notice.open_link}|open>" if notice.open_link else ""
        text = f"{title}\n{detail}{link}"
        out: dict[str, object] = {"text": text}
        if self._spec.blocks:
            context = f"committed {notice.at.isoformat()} · key `{_slack_escape(notice.key)}`"
            if notice.hint:
                context = f"{_slack_escape(notice.hint)}\n{context}"
            out["blocks"] = [
                {"type": "section", "text": {"type": "mrkdwn", "text": f"{title}{link}"}},
                {"type": "section", "text": {"type": "mrkdwn", "text": detail or " "}},
                {"type": "context", "elements": [{"type": "mrkdwn", "text": context}]},
            ]
        return out

    async def send(self, notice: Notice) -> None:
        """POST the message.

        Raises:
            ChannelError: not a 2xx answer, a timeout or a connection error.
        """
        body = msgspec.json.encode(self.payload(notice))
        await _post(
            self._session, self._name, self._spec.url, body, _key_headers(notice),
            self._spec.timeout_s,
        )  # fmt: skip


class EmailChannel:
    """E-mail through SMTP (stdlib ``smtplib``, run in a worker thread)."""

    def __init__(self, name: str, spec: EmailSpec, *, limit: int = 4) -> None:
        """Send through ``spec.host``, at most ``limit`` connections at once."""
        self._name, self._spec = name, spec
        self._limit = asyncio.Semaphore(limit)

    @property
    def name(self) -> str:
        """The channel's name."""
        return self._name

    def message(self, notice: Notice) -> EmailMessage:
        """Return the e-mail for ``notice``."""
        spec = self._spec
        msg = EmailMessage()
        msg["From"] = spec.sender
        msg["To"] = ", ".join(spec.to)
        msg["Subject"] = f"[dispatch] {notice.severity}: job {notice.job_id}: {notice.id}"
        msg["Date"] = format_datetime(notice.at)
        # The same escalation always gets the same Message-ID, so a resent copy is a duplicate
        # to mail clients and archives.
        digest = hashlib.sha256(notice.key.encode()).hexdigest()[:32]
        domain = spec.sender.rpartition("@")[2] or "dispatch"
        msg["Message-ID"] = f"<escalation-{digest}@{domain}>"
        msg["Auto-Submitted"] = "auto-generated"
        msg["X-Dispatch-Job"] = notice.job_id
        msg["X-Dispatch-Escalation-Id"] = notice.id
        lines = [
            f"dispatch job {notice.job_id} needs a decision: {notice.id}",
            "",
            notice.detail,
            "",
            f"Severity:  {notice.severity}",
            f"Committed: {notice.at.isoformat()}",
        ]
        if notice.open_link:
            lines.append(f"Job:       {notice.open_link}")
        if notice.hint:
            lines += ["", notice.hint]
        lines += ["", f"Escalation key: {notice.key}"]
        msg.set_content("\n".join(lines) + "\n")
        return msg

    async def send(self, notice: Notice) -> None:
        """Send the e-mail; return once the SMTP server accepted it for a recipient.

        Raises:
            ChannelError: the server refused it (``rejected``) or couldn't be reached, timed
                out or failed (``failed``).
        """
        msg = self.message(notice)
        async with self._limit:
            await asyncio.to_thread(self._send_sync, msg)

    def _send_sync(self, msg: EmailMessage) -> None:
        spec = self._spec
        try:
            smtp: smtplib.SMTP
            if spec.security == "ssl":
                smtp = smtplib.SMTP_SSL(
                    spec.host,
                    spec.port,
                    timeout=spec.timeout_s,
                    context=ssl.create_default_context(),
                )
            else:
                smtp = smtplib.SMTP(spec.host, spec.port, timeout=spec.timeout_s)
            with smtp:
                if spec.security == "starttls":
                    smtp.starttls(context=ssl.create_default_context())
                if spec.username:
                    smtp.login(spec.username, spec.password)
                smtp.send_message(msg, from_addr=spec.sender, to_addrs=list(spec.to))
        except smtplib.SMTPResponseException as err:
            outcome: Literal["failed", "rejected"] = "failed" if err.smtp_code < 500 else "rejected"
            raise ChannelError(
                self._name, f"SMTP {err.smtp_code} from {spec.host}:{spec.port}", outcome=outcome
            ) from err
        except smtplib.SMTPRecipientsRefused as err:
            raise ChannelError(
                self._name, f"every recipient refused: {sorted(err.recipients)}", outcome="rejected"
            ) from err
        except (smtplib.SMTPException, OSError) as err:
            raise ChannelError(
                self._name, f"SMTP to {spec.host}:{spec.port} failed: {err!r}"
            ) from err


class TerminalChannel:
    """Print a line to stderr and append it to a log file: the channel of ``dispatch up``."""

    def __init__(self, name: str, spec: TerminalSpec, *, stream: TextIO | None = None) -> None:
        """Print to ``stream`` (stderr) and append to ``spec.log_file`` when set."""
        self._name = name
        self._path = Path(spec.log_file) if spec.log_file else None
        self._stream = stream
        self._lock = asyncio.Lock()

    @property
    def name(self) -> str:
        """The channel's name."""
        return self._name

    def line(self, notice: Notice) -> str:
        """The line written for ``notice``: its label (``ESCALATION``/``NOTICE``) first, so a
        reader of the terminal or the log (``dispatch up``) knows which it is."""
        parts = [notice.label, notice.at.isoformat(), notice.headline()]
        if notice.open_link:
            parts.append(f"({notice.open_link})")
        return " ".join(parts)

    async def send(self, notice: Notice) -> None:
        """Write the line; return once it is flushed to the file.

        Raises:
            ChannelError: the log file can't be written.
        """
        line = self.line(notice) + "\n"
        async with self._lock:  # whole lines, in order, even with deliveries in parallel
            try:
                await asyncio.to_thread(self._write, line)
            except OSError as err:
                raise ChannelError(self._name, f"can't write {self._path}: {err}") from err

    def _write(self, line: str) -> None:
        stream = self._stream or sys.stderr
        stream.write(line)
        stream.flush()
        if self._path is not None:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            with self._path.open("a", encoding="utf-8") as f:
                f.write(line)
                f.flush()


def build_channel(name: str, spec: ChannelSpec, session: aiohttp.ClientSession) -> Channel:
    """Return the channel ``spec`` describes, named ``name``."""
    match spec:
        case WebhookSpec():
            return WebhookChannel(name, spec, session)
        case SlackSpec():
            return SlackChannel(name, spec, session)
        case EmailSpec():
            return EmailChannel(name, spec)
        case TerminalSpec():
            return TerminalChannel(name, spec)
        case _:
            assert_never(spec)
