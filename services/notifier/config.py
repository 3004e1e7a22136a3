"""The notifier's configuration: environment variables, plus an optional routes file.

Everything simple comes from ``NOTIFIER_*`` variables (:class:`NotifierConfig`, built once in
``__main__`` by :func:`services.common.config.from_env`). Anything structured (more named
channels, routes by severity, the severity of id patterns) may go in a routes file, TOML or
JSON by its suffix, named by ``NOTIFIER_ROUTES_FILE`` (:class:`RoutesFile`).

The channels the environment configures are named after their kind: ``webhook``
(``NOTIFIER_WEBHOOK_URL``), ``slack`` (``NOTIFIER_SLACK_URL``), ``email``
(``NOTIFIER_SMTP_HOST`` and ``NOTIFIER_SMTP_TO``), and ``terminal``, which always exists.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Annotated, Final, Literal

import msgspec

from services.common.config import ConfigError, from_env
from services.common.nats_settings import NatsSettings, check_nats_settings
from services.notifier.routing import Route, Router, Severity, parse_route

__all__ = [
    "ChannelSpec",
    "EmailSpec",
    "NotifierConfig",
    "RouteSpec",
    "RoutesFile",
    "Setup",
    "SlackSpec",
    "TerminalSpec",
    "WebhookSpec",
    "build_setup",
    "load_config",
    "load_routes_file",
]

PREFIX: Final = "NOTIFIER_"
_CHANNEL_NAME: Final = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")

Seconds = Annotated[float, msgspec.Meta(gt=0)]
Fraction = Annotated[float, msgspec.Meta(ge=0, le=1)]
Port = Annotated[int, msgspec.Meta(ge=0, le=65535)]
Security = Literal["none", "starttls", "ssl"]


class NotifierConfig(NatsSettings, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Every ``NOTIFIER_<FIELD>`` variable (upper case); see the field docstrings.

    The NATS connection (:class:`~services.common.nats_settings.NatsSettings`):
    ``NOTIFIER_NATS_URL`` (comma-separated URLs), ``NOTIFIER_NATS_NKEY_SEED_FILE`` (the
    ``notifier`` identity's seed) or ``NOTIFIER_NATS_CREDS_FILE`` or ``NOTIFIER_NATS_USER``
    with ``NOTIFIER_NATS_PASSWORD_FILE``/``NOTIFIER_NATS_PASSWORD``,
    ``NOTIFIER_NATS_TLS_CA_FILE``, ``NOTIFIER_NATS_TLS_CERT_FILE``,
    ``NOTIFIER_NATS_TLS_KEY_FILE``, ``NOTIFIER_NATS_INBOX_PREFIX`` (``_INBOX.notifier``).
    """

    namespace: str = ""
    """Stream/subject namespace (empty: the public contract's names)."""
    stream_replicas: Annotated[int, msgspec.Meta(ge=1)] = 1
    """Replicas of the contract's streams, as the deployment creates them (checked at start)."""
    http_host: str = "127.0.0.1"
    """Address of ``/healthz`` and ``/metrics``."""
    http_port: Port = 8083
    """Port of ``/healthz`` and ``/metrics`` (0: any free port)."""
    shutdown_grace_s: Seconds = 10.0
    """On SIGTERM, how long deliveries in flight may take to finish before being cancelled."""
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_json: bool = True

    durable: str = "notifier"
    """Name of the durable consumer shared by every notifier replica."""
    ack_wait_s: Seconds = 30.0
    """A replica that dies mid-delivery loses the escalation to another after this long."""
    max_ack_pending: Annotated[int, msgspec.Meta(ge=1)] = 10_000
    """Most escalations waiting for delivery (retrying) at once, over all replicas."""
    fetch_batch: Annotated[int, msgspec.Meta(ge=1)] = 16
    """Record events a replica fetches at once."""
    concurrency: Annotated[int, msgspec.Meta(ge=1)] = 16
    """Escalations one replica delivers at once."""
    retry_base_s: Seconds = 2.0
    """Delay before the first retry of a failed delivery; doubled each time."""
    retry_max_s: Seconds = 300.0
    """Longest delay between retries (a failing channel is retried forever)."""
    retry_jitter: Fraction = 0.2
    """Each delay is shortened by up to this fraction, at random."""
    audit_interval_s: Seconds = 30.0
    """How often the undelivered-escalations gauges are refreshed from the records."""

    api_url: str = ""
    """Base URL of dispatch's API; when set, notices link to the job's web page
    ``<api_url>/#/job/<job>`` (the webhook also carries ``<api_url>/v1/jobs/<job>``)."""
    http_timeout_s: Seconds = 10.0
    """Timeout of one webhook or Slack POST."""
    webhook_url: str = ""
    """Generic webhook: JSON POST of each escalation."""
    webhook_secret: str = ""
    """When set, webhook POSTs carry ``X-Dispatch-Signature: sha256=<HMAC of the body>``."""
    slack_url: str = ""
    """Slack-compatible incoming webhook."""
    slack_blocks: bool = False
    """Send Block Kit ``blocks`` beside ``text``."""
    smtp_host: str = ""
    smtp_port: Port = 25
    smtp_security: Security = "none"
    smtp_username: str = ""
    smtp_password: str = ""
    smtp_from: str = "dispatch@localhost"
    smtp_to: list[str] = msgspec.field(default_factory=list)
    """Recipients, comma-separated."""
    smtp_timeout_s: Seconds = 30.0
    log_file: str = ""
    """File the ``terminal`` channel appends escalations to (besides stderr)."""
    routes: list[str] = msgspec.field(default_factory=list)
    """Routes, comma-separated, first match wins: ``failed:*|cleanup-deadline=email+slack``,
    ``@warning=slack`` (by severity), ``*=webhook``."""
    routes_file: str = ""
    """Optional TOML or JSON file: more channels, routes, severities (:class:`RoutesFile`)."""
    held_notices: bool = False
    """Send a notice (id ``held:<instance>``, routed like an escalation) as soon as a job is
    held (a recovery hold or a person's hold), so the on-call knows it waits for them; it is
    not an escalation and nothing is recorded (``dispatch up`` turns it on)."""
    answer_command: str = "dispatch"
    """The command a held notice's answers name (``dispatch release JOB ...``): ``dispatch
    up`` sets the one its user ran it by (``.venv/bin/dispatch`` when the venv is not on
    ``PATH``), so the answer runs as printed in that terminal."""


class WebhookSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True,
                  tag="webhook", tag_field="type"):  # fmt: skip
    """A generic webhook channel: JSON POST of each escalation."""

    url: str
    secret: str = ""
    timeout_s: Seconds = 10.0
    headers: dict[str, str] = {}
    """Extra headers (e.g. ``Authorization``)."""


class SlackSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True,
                tag="slack", tag_field="type"):  # fmt: skip
    """A Slack-compatible incoming webhook (``{"text": ...}``, optionally with blocks)."""

    url: str
    blocks: bool = False
    timeout_s: Seconds = 10.0


class EmailSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True,
                tag="email", tag_field="type"):  # fmt: skip
    """E-mail through an SMTP server."""

    host: str
    to: list[str]
    port: Port = 25
    security: Security = "none"
    username: str = ""
    password: str = ""
    sender: str = msgspec.field(default="dispatch@localhost", name="from")
    timeout_s: Seconds = 30.0


class TerminalSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True,
                   tag="terminal", tag_field="type"):  # fmt: skip
    """Print to stderr and append to ``log_file`` (if set)."""

    log_file: str = ""


ChannelSpec = WebhookSpec | SlackSpec | EmailSpec | TerminalSpec


class RouteSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One route of a routes file: escalations it matches go to ``channels``.

    A route matches an escalation whose id matches one of ``ids`` (shell-style globs, e.g.
    ``failed:*``) and whose severity is one of ``severities``; an empty list matches all.
    """

    ids: list[str] = []
    severities: list[Severity] = []
    channels: list[str]


class RoutesFile(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The routes file (TOML or JSON).

    Example (TOML)::

        [channels.oncall]            # more channels, by name (beside webhook, slack, ...)
        type = "slack"
        url = "https://hooks.slack.com/services/..."

        [severity]                   # id glob -> severity, before the built-in table
        "overdue:*" = "critical"

        [[routes]]                   # first match wins; env routes come first
        ids = ["failed:*", "cleanup-deadline"]
        channels = ["email", "oncall"]

        [[routes]]
        severities = ["warning"]
        channels = ["slack"]

        default = ["webhook"]        # when no route matches
    """

    channels: dict[str, ChannelSpec] = {}
    severity: dict[str, Severity] = {}
    routes: list[RouteSpec] = []
    default: list[str] = []


class Setup(msgspec.Struct, frozen=True, kw_only=True):
    """The channels by name and the router, resolved from the config and the routes file."""

    channels: dict[str, ChannelSpec]
    router: Router


def load_config(env: Mapping[str, str]) -> NotifierConfig:
    """Build the config from ``NOTIFIER_*`` variables.

    Raises:
        ConfigError: an unknown variable or a bad value, naming it.
    """
    cfg = from_env(NotifierConfig, env, PREFIX)
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", cfg.durable):
        raise ConfigError(f"invalid configuration: {PREFIX}DURABLE {cfg.durable!r} is not a token")
    check_nats_settings(cfg, PREFIX)
    return cfg


def load_routes_file(path: Path) -> RoutesFile:
    """Read a routes file: TOML if its name ends in ``.toml``, else JSON.

    Raises:
        ConfigError: it can't be read or doesn't fit :class:`RoutesFile` (the message names
            the file and the path of the bad value).
    """
    try:
        data = path.read_bytes()
    except OSError as err:
        raise ConfigError(f"routes file {str(path)!r}: {err}") from err
    try:
        if path.suffix.lower() == ".toml":
            return msgspec.toml.decode(data, type=RoutesFile)
        return msgspec.json.decode(data, type=RoutesFile)
    except (msgspec.ValidationError, msgspec.DecodeError, tomllib.TOMLDecodeError) as err:
        raise ConfigError(f"routes file {str(path)!r}: {err}") from err


def build_setup(
    cfg: NotifierConfig, routes_file: RoutesFile | None = None, *, plugins: Collection[str] = ()
) -> Setup:
    """Resolve the channels and routes.

    The environment's channels come first (``webhook``, ``slack``, ``email`` when configured;
    ``terminal`` always), then the file's. Routes: the environment's, then the file's, first
    match wins. When nothing matches: the file's ``default``, else every channel configured
    (environment and file; ``terminal`` only if named), else ``terminal``.

    Args:
        cfg: the environment's configuration.
        routes_file: the routes file, if any.
        plugins: names of channels the caller supplies itself; routes may name them.

    Raises:
        ConfigError: a bad channel name, a channel defined twice, a route naming a channel
            that doesn't exist, or a malformed route.
    """
    file = routes_file or RoutesFile()
    channels: dict[str, ChannelSpec] = {}
    if cfg.webhook_url:
        channels["webhook"] = WebhookSpec(
            url=cfg.webhook_url, secret=cfg.webhook_secret, timeout_s=cfg.http_timeout_s
        )
    if cfg.slack_url:
        channels["slack"] = SlackSpec(
            url=cfg.slack_url, blocks=cfg.slack_blocks, timeout_s=cfg.http_timeout_s
        )
    if cfg.smtp_host:
        if not cfg.smtp_to:
            raise ConfigError(f"invalid configuration: {PREFIX}SMTP_HOST is set but not SMTP_TO")
        channels["email"] = EmailSpec(
            host=cfg.smtp_host,
            port=cfg.smtp_port,
            security=cfg.smtp_security,
            username=cfg.smtp_username,
            password=cfg.smtp_password,
            sender=cfg.smtp_from,
            to=list(cfg.smtp_to),
            timeout_s=cfg.smtp_timeout_s,
        )
    configured = tuple(channels)
    channels["terminal"] = TerminalSpec(log_file=cfg.log_file)
    for name, spec in file.channels.items():
        if not _CHANNEL_NAME.fullmatch(name):
            raise ConfigError(
                f"routes file: channel name {name!r} must be lower-case letters, digits, '-' or '_'"
            )
        if name in channels and name != "terminal":
            raise ConfigError(f"routes file: channel {name!r} is already configured")
        channels[name] = spec
    routes: list[Route] = []
    for text in cfg.routes:
        try:
            routes.append(parse_route(text))
        except ValueError as err:
            raise ConfigError(f"invalid configuration: {PREFIX}ROUTES: {err}") from err
    for spec_route in file.routes:
        if not spec_route.channels:
            raise ConfigError("routes file: a route names no channels")
        routes.append(
            Route(
                ids=tuple(spec_route.ids),
                severities=tuple(spec_route.severities),
                channels=tuple(spec_route.channels),
            )
        )
    configured += tuple(n for n in file.channels if n != "terminal")
    default = tuple(file.default) or configured or ("terminal",)
    known = set(channels) | set(plugins)
    for where, names in [*((r.describe(), r.channels) for r in routes), ("default", default)]:
        for name in names:
            if name not in known:
                raise ConfigError(
                    f"route {where}: no channel named {name!r} (configured: "
                    f"{', '.join(sorted(known))})"
                )
    router = Router(routes=tuple(routes), default=default, severity=tuple(file.severity.items()))
    return Setup(channels=channels, router=router)
