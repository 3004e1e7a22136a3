"""How every service connects to NATS: one settings struct, shared by the four configs.

Each service's config inherits :class:`NatsSettings`, so every service reads the same
variables under its own prefix (``API_``, ``SUPERVISOR_``, ``NOTIFIER_``, ``OBSERVER_``):

==============================  ===============================================================
variable (``<P>`` = prefix)     meaning
==============================  ===============================================================
``<P>NATS_URL``                 NATS server URL(s), comma-separated (default
                                ``nats://127.0.0.1:4222``); the client reconnects across them.
                                Logged with any ``user:password@`` replaced by ``***@``
``<P>NATS_NKEY_SEED_FILE``      file holding the service identity's nkey seed (``SU...``,
                                mode 0600; ``dispatch nats init`` makes it)
``<P>NATS_CREDS_FILE``          a ``.creds`` file (JWT + seed) instead, for a NATS with
                                decentralised JWT authentication
``<P>NATS_USER``                a user name, with a password instead of a key:
``<P>NATS_PASSWORD_FILE``       the file holding the password (first line), or
``<P>NATS_PASSWORD``            the password itself, from the environment (never argv)
``<P>NATS_TLS_CA_FILE``         CA bundle that signs the servers' certificates: TLS is used
                                (and required) when set
``<P>NATS_TLS_CERT_FILE``       client certificate (PEM) for servers that verify clients,
``<P>NATS_TLS_KEY_FILE``        and its key
``<P>NATS_INBOX_PREFIX``        prefix of the connection's reply subjects; the identity's own
                                (``_INBOX.<identity>``), as its permissions allow
==============================  ===============================================================

At most one of the seed file, the creds file and the user may be given; with none the
connection is anonymous, which a server configured by dispatch refuses. Files are checked
when the configuration is built (a missing file is a ``ConfigError`` naming its variable),
and read when connecting; no secret is logged, and the struct's ``repr`` hides the password.
"""

from __future__ import annotations

import re
import ssl
import urllib.parse
from pathlib import Path
from typing import Any

import msgspec

from dispatch_nats.urls import redact_url, redact_urls
from services.common.config import ConfigError

__all__ = ["NatsSettings", "check_nats_settings", "nats_options", "redact_url", "redact_urls"]

_SUBJECT_PREFIX = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*")


class NatsSettings(msgspec.Struct, frozen=True, kw_only=True):
    """The NATS connection settings every service config has (see the module docstring)."""

    nats_url: tuple[str, ...] = ("nats://127.0.0.1:4222",)
    """Server URLs; the client reconnects across them."""
    nats_nkey_seed_file: str = ""
    """File with the identity's nkey seed."""
    nats_creds_file: str = ""
    """A NATS ``.creds`` file (JWT authentication)."""
    nats_user: str = ""
    """User name (password authentication)."""
    nats_password_file: str = ""
    """File whose first line is the password."""
    nats_password: str = ""
    """The password itself (from the environment only; hidden from ``repr``)."""
    nats_tls_ca_file: str = ""
    """CA bundle of the servers' certificates; TLS when set."""
    nats_tls_cert_file: str = ""
    """Client certificate (PEM), for servers that verify clients."""
    nats_tls_key_file: str = ""
    """The client certificate's key (PEM)."""
    nats_inbox_prefix: str = ""
    """Prefix of reply subjects (``_INBOX.<identity>``; nats-py's ``_INBOX`` when empty)."""

    def __repr__(self) -> str:
        fields = []
        for name in self.__struct_fields__:
            value = getattr(self, name)
            if name == "nats_password" and value:
                value = "***"
            elif name == "nats_url":
                value = redact_urls(value)
            fields.append(f"{name}={value!r}")
        return f"{type(self).__name__}({', '.join(fields)})"


def check_nats_settings(settings: NatsSettings, prefix: str) -> None:
    """Check the NATS settings once, at start-up; errors name the variable.

    Raises:
        ConfigError: no URL, a URL that is not ``nats://``/``tls://``/``ws://``/``wss://``,
            two ways of authenticating, a password without a user (or the reverse), a
            certificate without its key, a file that can't be read, or a bad inbox prefix.
    """

    def var(name: str) -> str:
        return f"{prefix}{name.upper()}"

    if not settings.nats_url:
        raise ConfigError(f"{var('nats_url')} names no server")
    for url in settings.nats_url:
        scheme = urllib.parse.urlsplit(url).scheme if "://" in url else "nats"
        if scheme not in ("nats", "tls", "ws", "wss"):
            raise ConfigError(
                f"{var('nats_url')}: {redact_url(url)!r} is not a nats://, tls://, ws:// or "
                "wss:// URL"
            )
    ways = [
        name
        for name in ("nats_nkey_seed_file", "nats_creds_file", "nats_user")
        if getattr(settings, name)
    ]
    if len(ways) > 1:
        raise ConfigError(
            f"give one of {', '.join(var(w) for w in ways)}, not several (one identity each)"
        )
    if settings.nats_password_file and settings.nats_password:
        raise ConfigError(f"give {var('nats_password_file')} or {var('nats_password')}, not both")
    has_password = bool(settings.nats_password_file or settings.nats_password)
    if settings.nats_user and not has_password:
        raise ConfigError(f"{var('nats_user')} needs {var('nats_password_file')}")
    if has_password and not settings.nats_user:
        raise ConfigError(f"a NATS password needs {var('nats_user')}")
    if bool(settings.nats_tls_cert_file) != bool(settings.nats_tls_key_file):
        raise ConfigError(f"give both {var('nats_tls_cert_file')} and {var('nats_tls_key_file')}")
    for name in (
        "nats_nkey_seed_file",
        "nats_creds_file",
        "nats_password_file",
        "nats_tls_ca_file",
        "nats_tls_cert_file",
        "nats_tls_key_file",
    ):
        path = getattr(settings, name)
        if not path:
            continue
        try:
            with Path(path).open("rb"):
                pass
        except OSError as err:
            raise ConfigError(f"{var(name)}: can't read {path}: {err.strerror}") from None
    if settings.nats_inbox_prefix and not _SUBJECT_PREFIX.fullmatch(settings.nats_inbox_prefix):
        raise ConfigError(
            f"{var('nats_inbox_prefix')}: {settings.nats_inbox_prefix!r} is not a subject prefix "
            "(tokens of letters, digits, '_' and '-', separated by dots)"
        )
    if settings.nats_tls_ca_file or settings.nats_tls_cert_file:
        try:
            tls_context(settings)
        except (ssl.SSLError, OSError) as err:
            raise ConfigError(f"{prefix}NATS_TLS_*: {err}") from None


def tls_context(settings: NatsSettings) -> ssl.SSLContext | None:
    """The TLS context of the settings (None without a CA or a client certificate).

    Raises:
        ssl.SSLError: a file does not hold what it should.
        OSError: a file can't be read.
    """
    if not (settings.nats_tls_ca_file or settings.nats_tls_cert_file):
        return None
    ctx = ssl.create_default_context(
        ssl.Purpose.SERVER_AUTH, cafile=settings.nats_tls_ca_file or None
    )
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if settings.nats_tls_cert_file:
        ctx.load_cert_chain(settings.nats_tls_cert_file, settings.nats_tls_key_file)
    return ctx


def nats_options(settings: NatsSettings) -> dict[str, Any]:
    """The keyword arguments of ``nats.connect`` (or ``Client.connect``) for ``settings``:
    servers, credentials, TLS and inbox prefix (no reconnect policy: the caller's).

    Raises:
        ConfigError: the password file or a TLS file can't be read any more.
    """
    opts: dict[str, Any] = {"servers": list(settings.nats_url)}
    if settings.nats_nkey_seed_file:
        opts["nkeys_seed"] = settings.nats_nkey_seed_file
    if settings.nats_creds_file:
        opts["user_credentials"] = settings.nats_creds_file
    if settings.nats_user:
        password = settings.nats_password
        if settings.nats_password_file:
            try:
                text = Path(settings.nats_password_file).read_text()
            except OSError as err:
                raise ConfigError(
                    f"can't read the NATS password file {settings.nats_password_file}: "
                    f"{err.strerror}"
                ) from None
            password = text.splitlines()[0] if text else ""
        opts["user"] = settings.nats_user
        opts["password"] = password
    try:
        ctx = tls_context(settings)
    except (ssl.SSLError, OSError) as err:
        raise ConfigError(f"NATS TLS files: {err}") from None
    if ctx is not None:
        opts["tls"] = ctx
    if settings.nats_inbox_prefix:
        opts["inbox_prefix"] = settings.nats_inbox_prefix
    return opts
