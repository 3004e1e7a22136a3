"""A nats-server locked the way dispatch locks it, for tests: one nkey identity per service,
the configuration rendered by `dispatch_nats.permissions.render_server_config`, optional TLS.

    site = LockedNats(tmp_path, clusters=("local",))
    site.start()
    nc = await site.connect("api")           # as the api identity, its own inbox prefix
    env = site.service_env("api")            # API_NATS_URL, API_NATS_NKEY_SEED_FILE, ...
    site.stop()

Nothing is mocked: the server is the real nats-server, the identities real nkeys, the
permissions those `dispatch up` and `dispatch nats init` write.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nats.aio.client import Client as NATS

from dispatch_cli.natsite import service_env, write_private_text
from dispatch_nats import DEFAULT_LAYOUT, Layout
from dispatch_nats.identities import make_identities, seed_path
from dispatch_nats.permissions import (
    Identity,
    TlsBlock,
    inbox_prefix,
    render_server_config,
    service_identities,
    users,
)
from tests.servers.nats import NatsServer

__all__ = ["LockedNats", "connect_or_close"]


class LockedNats:
    """A real nats-server with dispatch's identities and permissions (module docstring)."""

    def __init__(
        self,
        root: Path,
        *,
        clusters: Sequence[str] = ("local",),
        layout: Layout = DEFAULT_LAYOUT,
        tls: TlsBlock | None = None,
        supervisor_durable: str = "supervisor",
        notifier_durable: str = "notifier",
    ) -> None:
        """Make the identities under ``root/identities`` and write ``root/nats.conf``."""
        self.root = root
        self.layout = layout
        self.identities_dir = root / "identities"
        self.keys = make_identities(self.identities_dir, service_identities(clusters))
        root.mkdir(parents=True, exist_ok=True)
        self.config_path = root / "nats.conf"
        write_private_text(
            self.config_path,
            render_server_config(
                users(
                    layout,
                    self.keys,
                    supervisor_durable=supervisor_durable,
                    notifier_durable=notifier_durable,
                ),
                port=-1,
                store_dir=str(root / "store"),
                server_name="locked",
                tls=tls,
            ),
        )
        self.server = NatsServer(root / "store", config_file=self.config_path)

    def start(self) -> None:
        """Start the server (waits for "Server is ready")."""
        self.server.start()

    def stop(self) -> None:
        """Stop the server."""
        self.server.stop()

    @property
    def url(self) -> str:
        """The client URL."""
        return self.server.url

    def seed(self, identity: str) -> Path:
        """The seed file of ``identity`` (e.g. ``"observer-local"``)."""
        return seed_path(self.identities_dir, Identity.parse(identity))

    def service_env(self, identity: str, *, tls_ca: str = "") -> dict[str, str]:
        """The ``<PREFIX>NATS_*`` variables of the service of ``identity``."""
        return service_env(
            Identity.parse(identity),
            urls=(self.url,),
            identities_dir=self.identities_dir,
            layout=self.layout,
            tls_ca=tls_ca,
        )

    async def connect(
        self,
        identity: str | None,
        errors: list[Exception] | None = None,
        *,
        tls: ssl.SSLContext | None = None,
        **options: Any,
    ) -> NATS:
        """Connect as ``identity`` (None: without credentials) with its inbox prefix; client
        errors (permission violations) go to ``errors``.

        Raises:
            nats.errors.Error: the server refused the connection (e.g. no credentials).
        """
        sink = errors if errors is not None else []

        async def error_cb(err: Exception) -> None:
            sink.append(err)

        kw: dict[str, Any] = {
            "servers": [self.url],
            "error_cb": error_cb,
            "connect_timeout": 2,
            "allow_reconnect": False,
            "max_reconnect_attempts": 1,  # 0 would retry the first connect for ever
            "reconnect_time_wait": 0.1,
            **options,
        }
        if identity is not None:
            ident = Identity.parse(identity)
            kw["nkeys_seed"] = str(seed_path(self.identities_dir, ident))
            kw["inbox_prefix"] = inbox_prefix(ident, self.layout)
        if tls is not None:
            kw["tls"] = tls
        return await connect_or_close(**kw)


async def connect_or_close(*, total_timeout_s: float = 20.0, **options: Any) -> NATS:
    """``nats.connect(**options)`` within ``total_timeout_s``; a refused connection is closed
    before the error is raised (nats-py leaves its socket open otherwise, a ResourceWarning
    in a later test). nats-py reports a failed TLS handshake to ``error_cb`` and may then
    keep trying the same server, hence the overall timeout.

    Raises:
        nats.errors.Error, OSError, ssl.SSLError: the connection was refused or failed.
        TimeoutError: it did not succeed within ``total_timeout_s`` (see ``error_cb``).
    """
    nc = NATS()
    try:
        async with asyncio.timeout(total_timeout_s):
            await nc.connect(**options)
    except BaseException:
        # close() can hang on a client whose TLS handshake failed: bounded
        with contextlib.suppress(Exception):
            async with asyncio.timeout(2):
                await nc.close()
        raise
    return nc
