"""The API service's ``run``: connect to NATS, make sure the streams exist, serve HTTP until
``stop`` is set, then shut down in order (STYLE.md, "Services")."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from prometheus_client import CollectorRegistry

from dispatch_core import WriterKind
from dispatch_nats import LatestStore, Layout, RecordStore
from services.api.app import make_app
from services.api.auth import Authenticator
from services.api.clusters import ApiClusters, load_clusters_file
from services.api.config import ApiConfig
from services.api.metrics import ApiMetrics
from services.api.operations import Operations
from services.api.output import OutputClient
from services.common.config import ConfigError
from services.common.http import start_http
from services.common.lifecycle import open_nats

__all__ = ["run"]

log = logging.getLogger("services.api")


def _authenticator(cfg: ApiConfig) -> Authenticator:
    if not cfg.tokens_file:
        raise ConfigError(
            "API_TOKENS_FILE is not set: the API needs a tokens file (see services.api.auth)"
        )
    auth = Authenticator.from_file(cfg.tokens_file)
    if not len(auth):
        raise ConfigError(f"tokens file {cfg.tokens_file!r} lists no token: nobody could call")
    return auth


async def run(
    cfg: ApiConfig,
    stop: asyncio.Event,
    *,
    registry: CollectorRegistry | None = None,
    on_listening: Callable[[int], None] | None = None,
) -> None:
    """Serve the API until ``stop`` is set.

    Reads the tokens and clusters files, connects to NATS (retrying until it answers or
    ``stop`` is set), creates the streams if missing, and serves HTTP on
    ``cfg.http_host:cfg.http_port``. At stop: the listener closes, SSE streams end, requests
    in flight finish, the stores and the connection are drained.

    Args:
        cfg: the configuration.
        stop: set it to stop the service.
        registry: the Prometheus registry (a fresh one by default).
        on_listening: called with the bound port once requests are served.

    Raises:
        ConfigError: no or a bad tokens file, or a bad clusters file.
    """
    auth = _authenticator(cfg)
    clusters = load_clusters_file(cfg.clusters_file) if cfg.clusters_file else ApiClusters({}, {})
    declarations = clusters.declarations
    if not declarations:
        log.warning("api.no_clusters", extra={"clusters_file": cfg.clusters_file})
    registry = registry if registry is not None else CollectorRegistry()
    metrics = ApiMetrics(registry)
    ready = asyncio.Event()
    layout = Layout(namespace=cfg.namespace)
    async with contextlib.AsyncExitStack() as stack:
        nc = await open_nats(
            stack,
            cfg,
            stop,
            name="dispatch-api",
            replicas=cfg.stream_replicas,
            layout=layout,
            drain_s=cfg.shutdown_grace_s,
        )
        if nc is None:
            return
        records = RecordStore(nc, writer=WriterKind.API, layout=layout)
        stack.push_async_callback(records.aclose)
        statuses = LatestStore.status(nc, layout=layout)
        stack.push_async_callback(statuses.aclose)
        discoveries = LatestStore.discovery(nc, layout=layout)
        stack.push_async_callback(discoveries.aclose)
        ops = Operations(
            records=records,
            statuses=statuses,
            discoveries=discoveries,
            declarations=declarations,
            cluster_configs=clusters.configs,
            unix_users=auth.unix_users,
            metrics=metrics,
            attempts=cfg.command_attempts,
            concurrency=cfg.list_concurrency,
        )
        app = make_app(
            ops,
            auth,
            registry=registry,
            metrics=metrics,
            ready=ready,
            max_body_bytes=cfg.max_body_bytes,
            sse_heartbeat_s=cfg.sse_heartbeat_s,
            output=OutputClient(nc, layout=layout),
        )
        runner, port = await start_http(app, cfg.http_host, cfg.http_port)
        stack.push_async_callback(runner.cleanup)
        ready.set()
        log.info(
            "api.listening",
            extra={
                "host": cfg.http_host,
                "port": port,
                "clusters": sorted(declarations),
                "tokens": len(auth),
            },
        )
        if on_listening is not None:
            on_listening(port)
        # Build the jobs index now rather than in the first listing's time.
        warming = asyncio.create_task(ops.index.warm())
        await stop.wait()
        warming.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await warming
        log.info("api.stopping")
    log.info("api.stopped")
