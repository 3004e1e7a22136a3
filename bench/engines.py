"""The NATS engines a benchmark runs on: one server, or a 3-server JetStream cluster.

Each benchmark measures the same thing on every engine it is given, in one run, so the
figures it prints side by side come from the same machine under the same load.

    with nats_engine("cluster", tmp) as engine:
        nc = await nats.connect(engine.urls)
        await ensure_streams(nc, engine.replicas, layout=layout)

Authorization is one option here: with ``users`` every server's config is the one
``dispatch_nats.permissions.render_server_config`` writes for a site (those users and their
permissions, no anonymous user; a cluster block on the cluster), so the figures include it.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TextIO

from dispatch_nats.permissions import User, render_server_config
from tests.servers.nats import NatsCluster, NatsServer

__all__ = ["ENGINES", "Engine", "EngineKind", "nats_engine", "on_engines"]

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
def nats_engine(
    kind: EngineKind,
    tmp: Path,
    *,
    include: Path | None = None,
    users: Sequence[User] | None = None,
) -> Iterator[Engine]:
    """Start the engine under ``tmp``; stop it on exit.

    Args:
        kind: ``server`` (one nats-server) or ``cluster`` (3 servers on loopback, R3 streams).
        tmp: a directory of its own.
        include: a nats-server config file every server includes (without ``users``).
        users: lock the engine: only these users, with their permissions.
    """
    if kind == "server":
        if users is not None:
            config = tmp / "nats.conf"
            config.write_text(
                render_server_config(
                    users, port=-1, store_dir=str(tmp / "store"), server_name="bench"
                )
            )
            server = NatsServer(tmp / "store", config_file=config)
        else:
            extra = ("-c", str(include)) if include is not None else ()
            server = NatsServer(tmp / "store", extra_args=extra)
        server.start()
        try:
            yield Engine(kind, [server.url], 1)
        finally:
            server.stop()
    else:
        cluster = NatsCluster(tmp / "cluster", include=include, users=users)
        cluster.start()
        try:
            yield Engine(kind, cluster.urls, 3)
        finally:
            cluster.stop()


async def on_engines(
    args: argparse.Namespace,
    run_on: Callable[[EngineKind, argparse.Namespace], Awaitable[dict[str, float]]],
    *,
    shown: Sequence[str],
    spec: str,
    ratio_of: str,
    out: TextIO,
) -> dict[str, object]:
    """Measure on one server, and with ``args.cluster`` on a 3-server cluster too.

    The result is the server's figures with ``auth`` (``args.auth``); with the cluster, the
    ``shown`` figures are printed side by side on ``out`` (each as format ``spec``), and the
    result adds ``cluster`` (its figures) and ``cluster_over_server`` (the ratio of
    ``ratio_of``).
    """
    kinds: list[EngineKind] = ["server", "cluster"] if args.cluster else ["server"]
    figures = {kind: await run_on(kind, args) for kind in kinds}
    result: dict[str, object] = dict(figures["server"])
    result["auth"] = args.auth
    if args.cluster:
        server, cluster = figures["server"], figures["cluster"]
        width = max(map(len, shown)) + 4
        print(f"\n{'':{width}}{'one server':>14}{'3-server cluster':>20}", file=out)
        for key in shown:
            print(f"{key:{width}}{server[key]:>14{spec}}{cluster[key]:>20{spec}}", file=out)
        result["cluster"] = cluster
        result["cluster_over_server"] = round(cluster[ratio_of] / server[ratio_of], 3)
    return result
