"""The NATS engines a benchmark runs on: one server, or a 3-server JetStream cluster.

Each benchmark measures the same thing on every engine it is given, in one run, so the
figures it prints side by side come from the same machine under the same load.

    with nats_engine("cluster", tmp) as engine:
        nc = await nats.connect(engine.urls)
        await ensure_streams(nc, engine.replicas, layout=layout)

Turning authorization on is one option here: ``include`` is a nats-server config file every
server of the engine includes (accounts, users and permissions), and ``Engine`` is where the
services' credentials go once the services take them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tests.servers.nats import NatsCluster, NatsServer

__all__ = ["ENGINES", "Engine", "EngineKind", "nats_engine"]

EngineKind = Literal["server", "cluster"]
ENGINES: tuple[EngineKind, ...] = ("server", "cluster")


@dataclass(frozen=True)
class Engine:
    """A running engine."""

    kind: EngineKind
    urls: list[str]
    """Every server's client URL."""
    replicas: int
    """The streams' replicas on it (1 on one server, 3 on the cluster)."""

    @property
    def url(self) -> str:
        """The URLs as one comma list (a service's ``*_NATS_URL``)."""
        return ",".join(self.urls)


@contextlib.contextmanager
def nats_engine(kind: EngineKind, tmp: Path, *, include: Path | None = None) -> Iterator[Engine]:
    """Start the engine under ``tmp``; stop it on exit.

    Args:
        kind: ``server`` (one nats-server) or ``cluster`` (3 servers on loopback, R3 streams).
        tmp: a directory of its own.
        include: a nats-server config file every server includes (authorization).
    """
    if kind == "server":
        extra = ("-c", str(include)) if include is not None else ()
        server = NatsServer(tmp / "store", extra_args=extra)
        server.start()
        try:
            yield Engine(kind, [server.url], 1)
        finally:
            server.stop()
    else:
        cluster = NatsCluster(tmp / "cluster", include=include)
        cluster.start()
        try:
            yield Engine(kind, cluster.urls, 3)
        finally:
            cluster.stop()
