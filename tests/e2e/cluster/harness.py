"""A dispatch installation on a 3-server JetStream cluster, for the cluster end-to-end tests:
a :class:`~tests.e2e.runtime.harness.Runtime` (local backend, namespace, clusters file) whose
streams have 3 replicas and whose four services (observer, supervisor replicas, API,
notifier) run as processes given every server's URL, as a site would deploy them.

The environments of the four services are built here (:func:`service_env`), so a test can
also start one of them on its own (against a server not yet up, for instance).

Authorization is on: given a :class:`~tests.servers.locked_nats.LockedNats` site (its servers'
configs rendered by ``dispatch_nats.permissions``), every service connects as its own
identity (its nkey seed file and inbox prefix, as ``dispatch up`` hands them over) and the
test's own connection as the site's harness user (what it appends in a service's stead goes
out as that writer's identity).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Final

import nats
from nats.aio.client import Client as NATS

from dispatch_core import WriterKind
from dispatch_nats import LatestStore, StreamKind
from services.common.lifecycle import ensure_streams_until
from tests.e2e.installation import Subprocess
from tests.e2e.runtime.harness import Runtime
from tests.servers.locked_nats import LockedNats, identity_of
from tests.servers.nats import free_port
from tests.util import AsTheirWriters

__all__ = ["API_TOKEN", "SERVICES", "ClusterRuntime", "service_env", "tokens_toml"]

API_TOKEN: Final = "alice-cluster-0123456789abcdef"
SERVICES: Final = ("api", "observer", "supervisor", "notifier")
"""The four services (``python -m services.<name>``)."""


def tokens_toml() -> str:
    """The API's tokens file: one person, ``alice``, with :data:`API_TOKEN`."""
    return f'[[tokens]]\nactor = "alice"\nkind = "human"\ntoken = "{API_TOKEN}"\n'


def service_env(
    service: str,
    *,
    nats_url: str,
    namespace: str,
    tmp: Path,
    replicas: int = 1,
    clusters_file: Path | None = None,
    webhook_url: str = "",
    cluster: str = "local",
    poll_interval_s: float = 0.5,
    site: LockedNats | None = None,
) -> dict[str, str]:
    """The environment of ``python -m services.<service>`` (its own variables only).

    Args:
        service: ``api``, ``observer``, ``supervisor`` or ``notifier``.
        nats_url: the NATS URL(s), a comma list.
        namespace: the installation's namespace.
        tmp: where the API's tokens file (and an empty clusters file) may be written.
        replicas: the streams' replicas.
        clusters_file: the clusters file (observer, supervisor, API); default: a file in
            ``tmp`` naming one local cluster.
        webhook_url: the notifier's webhook (default: a port nobody listens on).
        cluster: the observer's cluster.
        poll_interval_s: the observer's poll interval.
        site: a locked site: the service connects as its identity there (its URLs, seed
            file and inbox prefix; ``namespace`` must be the site's).
    """
    prefix = service.upper()
    if clusters_file is None:
        clusters_file = tmp / "clusters.toml"
        if not clusters_file.exists():
            clusters_file.write_text(
                f'[[clusters]]\nname = "{cluster}"\nbackend = "local"\n'
                f'data_dir = "{tmp / "local"}"\n'
            )
    env = {
        "NATS_URL": nats_url,
        "NAMESPACE": namespace,
        "STREAM_REPLICAS": str(replicas),
        "HTTP_PORT": str(free_port()),
        "LOG_LEVEL": "info",
    }
    if service == "api":
        tokens = tmp / "tokens.toml"
        tokens.write_text(tokens_toml())
        env.update(TOKENS_FILE=str(tokens), CLUSTERS_FILE=str(clusters_file))
    elif service == "observer":
        env.update(
            CLUSTER=cluster,
            CLUSTERS_FILE=str(clusters_file),
            POLL_INTERVAL_S=str(poll_interval_s),
            STORE_TIMEOUT_S="10",
        )
    elif service == "supervisor":
        env.update(
            CLUSTERS_FILE=str(clusters_file),
            RETRY_S="1",
            LAUNCH_RETRY_S="5",
            STORE_TIMEOUT_S="10",
        )
    elif service == "notifier":
        env.update(
            WEBHOOK_URL=webhook_url or f"http://127.0.0.1:{free_port()}/hook",
            RETRY_BASE_S="0.2",
            RETRY_MAX_S="2",
            ACK_WAIT_S="10",
            AUDIT_INTERVAL_S="2",
        )
    else:
        raise ValueError(f"no service {service!r}")
    out = {f"{prefix}_{k}": v for k, v in env.items()}
    if site is not None:
        out.update(site.service_env(identity_of(service, cluster)))
    return out


class ClusterRuntime(Runtime):
    """A :class:`Runtime` whose streams have ``replicas`` copies and whose services are
    given every server's URL (``nats_url`` is a comma list); with ``site``, on that locked
    site (its URLs and layout), each service as its own identity."""

    def __init__(
        self,
        nats_url: str,
        tmp: Path,
        *,
        replicas: int = 3,
        site: LockedNats | None = None,
        **options: Any,
    ) -> None:
        super().__init__(site.url if site is not None else nats_url, tmp, **options)
        self.replicas = replicas
        self.site = site
        self._writers: dict[WriterKind, NATS] = {}
        if site is not None:
            self.layout = site.layout  # the permissions were rendered for its names

    async def open(self) -> None:
        """Connect to every server (the test's own reads and writes), create the streams."""
        self._nc = await nats.connect(
            self.nats_url.split(","),
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.1,
            **(self.site.client_options() if self.site is not None else {}),
        )
        # As the services do: a cluster just started may still be settling its meta leader.
        created = ensure_streams_until(self._nc, asyncio.Event(), self.replicas, layout=self.layout)
        assert await asyncio.wait_for(created, 120), "the streams were never created"
        # Reads checked against the stream's leader: the test's verdicts must not come from
        # a replica still catching up after a fault it injected.
        wait_s = 20.0
        # On a locked site what the test appends in a service's stead (a submission, an
        # operator's command) goes out as that writer's identity, on its own connection.
        if self.site is not None:
            for kind in WriterKind:
                self._writers[kind] = await nats.connect(
                    self.nats_url.split(","),
                    max_reconnect_attempts=-1,
                    reconnect_time_wait=0.1,
                    **self.site.client_options(kind.value),
                )
        self._records = AsTheirWriters(
            self._nc,
            layout=self.layout,
            connections=self._writers,
            ack_timeout_s=wait_s,
            read_timeout_s=wait_s,
            check_reads=True,
        )
        self._statuses, self._discoveries = (
            LatestStore(
                self._nc,
                kind,
                layout=self.layout,
                ack_timeout_s=wait_s,
                read_timeout_s=wait_s,
                read_from_leader=True,
            )
            for kind in (StreamKind.STATUS, StreamKind.DISCOVERY)
        )

    async def close(self) -> None:
        """As :meth:`Runtime.close`, and close the writers' connections."""
        try:
            await super().close()
        finally:
            for nc in self._writers.values():
                await nc.close()
            self._writers.clear()

    def observer_env(self, **extra: str) -> dict[str, str]:
        """The in-process or ``observer_process`` environment, as the site's observer."""
        return {**super().observer_env(**extra), **self._identity_env("observer")}

    def supervisor_env(self, **extra: str) -> dict[str, str]:
        """The in-process or ``supervisor_process`` environment, as the site's supervisor."""
        return {**super().supervisor_env(**extra), **self._identity_env("supervisor")}

    def _identity_env(self, service: str) -> dict[str, str]:
        if self.site is None:
            return {}
        return self.site.service_env(identity_of(service, self.backend.cluster))

    def env(self, service: str, **extra: str) -> dict[str, str]:
        """``service``'s environment in this installation (plus ``extra`` variables, named
        without the service's prefix)."""
        env = service_env(
            service,
            nats_url=self.nats_url,
            namespace=self.layout.namespace,
            tmp=self.tmp,
            replicas=self.replicas,
            clusters_file=self.clusters_file,
            poll_interval_s=self.poll_interval_s,
            site=self.site,
        )
        env.update({f"{service.upper()}_{k.upper()}": v for k, v in extra.items()})
        return env

    async def process(self, service: str, *, name: str | None = None, **extra: str) -> Subprocess:
        """Start ``python -m services.<service>`` and wait until its ``/healthz`` says 200."""
        name = name or service
        env = {**self.env(service, **extra), "PYTHONUNBUFFERED": "1"}
        return await self._start(
            Subprocess(name, f"services.{service}", env, self.tmp / f"{name}.log")
        )
