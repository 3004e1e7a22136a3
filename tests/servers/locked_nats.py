"""A nats-server locked the way dispatch locks it, for tests: one nkey identity per service,
the configuration rendered by `dispatch_nats.permissions.render_server_config`, optional TLS.

    site = LockedNats(tmp_path, clusters=("local",))
    site.start()
    nc = await site.connect("api")           # as the api identity, its own inbox prefix
    env = site.service_env("api")            # API_NATS_URL, API_NATS_NKEY_SEED_FILE, ...
    site.stop()

With ``size=3`` it is a 3-server JetStream cluster (:class:`~tests.servers.nats.NatsCluster`,
``site.cluster``) whose servers' configs are the same rendering with a cluster block; with
``harness=True`` the config also admits the test's own connection (``site.connect("harness")``),
a user with every permission that plays the person and checks the verdicts (the services
still run as their own identities). It takes the place of the read-only ``reader`` unless
``reader=True`` keeps that one too (the harness then has a slot of its own).

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
    Permissions,
    Role,
    TlsBlock,
    User,
    inbox_prefix,
    render_server_config,
    service_identities,
    users,
)
from tests.servers.nats import NatsCluster, NatsServer

__all__ = ["HARNESS", "LockedNats", "connect_or_close", "identity_of"]

HARNESS = "harness"
"""The name :meth:`LockedNats.connect` takes for the test's own all-permissions user."""
_HARNESS_IDENTITY = Identity(Role.READER)
"""The identity slot (and seed file) the harness user takes."""
_HARNESS_BESIDE_READER = Identity(Role.OBSERVER, "harness")
"""Its slot when the reader is admitted too (``observer-harness``, no observer's)."""
_ALL = Permissions(publish=(">",), subscribe=(">",))


def identity_of(service: str, cluster: str = "local") -> str:
    """The identity of ``python -m services.<service>`` (an observer's names its cluster)."""
    return f"observer-{cluster}" if service == "observer" else service


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
        size: int = 1,
        harness: bool = False,
        reader: bool | None = None,
    ) -> None:
        """Make the identities under ``root/identities`` and write ``root/nats.conf`` (one
        server; with ``size`` > 1, each server's config of the cluster under ``root/cluster``).
        """
        self.root = root
        self.layout = layout
        self.identities_dir = root / "identities"
        with_reader = not harness if reader is None else reader
        self._harness_identity = _HARNESS_BESIDE_READER if with_reader else _HARNESS_IDENTITY
        self.keys = make_identities(
            self.identities_dir, service_identities(clusters, reader=with_reader)
        )
        admitted = users(
            layout,
            self.keys,
            supervisor_durable=supervisor_durable,
            notifier_durable=notifier_durable,
        )
        if harness:
            ident = self._harness_identity
            key = make_identities(self.identities_dir, [ident])[ident]
            admitted.append(User(identity=ident, nkey=key, permissions=_ALL))
        self.harness = harness
        root.mkdir(parents=True, exist_ok=True)
        self.config_path = root / "nats.conf"
        self.cluster: NatsCluster | None = None
        if size > 1:
            self.cluster = NatsCluster(root / "cluster", size=size, users=admitted)
            self.server = self.cluster.servers[0]
            return
        write_private_text(
            self.config_path,
            render_server_config(
                admitted,
                port=-1,
                store_dir=str(root / "store"),
                server_name="locked",
                tls=tls,
            ),
        )
        self.server = NatsServer(root / "store", config_file=self.config_path)

    def start(self) -> None:
        """Start the server, or every server of the cluster (waits until they are ready)."""
        if self.cluster is not None:
            self.cluster.start()
        else:
            self.server.start()

    def stop(self) -> None:
        """Stop the server(s)."""
        if self.cluster is not None:
            self.cluster.stop()
        else:
            self.server.stop()

    @property
    def urls(self) -> list[str]:
        """Every server's client URL."""
        return self.cluster.urls if self.cluster is not None else [self.server.url]

    @property
    def url(self) -> str:
        """The client URL(s), a comma list on a cluster."""
        return ",".join(self.urls)

    def seed(self, identity: str) -> Path:
        """The seed file of ``identity`` (e.g. ``"observer-local"``, or ``"harness"``)."""
        return seed_path(self.identities_dir, self._identity(identity))

    def _identity(self, name: str) -> Identity:
        if name == HARNESS:
            if not self.harness:
                raise ValueError("this site admits no harness user (harness=False)")
            return self._harness_identity
        return Identity.parse(name)

    def client_options(self, identity: str = HARNESS) -> dict[str, Any]:
        """nats-py ``connect`` options of ``identity``: its seed and inbox prefix."""
        ident = self._identity(identity)
        return {
            "nkeys_seed": str(seed_path(self.identities_dir, ident)),
            "inbox_prefix": inbox_prefix(ident, self.layout),
        }

    def service_env(self, identity: str, *, tls_ca: str = "") -> dict[str, str]:
        """The ``<PREFIX>NATS_*`` variables of the service of ``identity``."""
        return service_env(
            Identity.parse(identity),
            urls=tuple(self.urls),
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
            "servers": self.urls,
            "error_cb": error_cb,
            "connect_timeout": 2,
            "allow_reconnect": False,
            "max_reconnect_attempts": 1,  # 0 would retry the first connect for ever
            "reconnect_time_wait": 0.1,
            **options,
        }
        if identity is not None:
            kw.update(self.client_options(identity))
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
