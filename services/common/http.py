"""``/healthz`` and ``/metrics`` for every service (aiohttp).

``/healthz`` answers 200 only once the service says its connections are up (``ready`` is
set), 503 before. ``/metrics`` serves the service's own Prometheus registry, created per
service and passed in, so each test gets a fresh one.
"""

from __future__ import annotations

import asyncio

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.aiohttp import make_aiohttp_handler

__all__ = ["health_app", "start_http"]


def health_app(
    registry: CollectorRegistry, ready: asyncio.Event, *, service: str
) -> web.Application:
    """Return an aiohttp app serving ``/healthz`` and ``/metrics``."""

    async def healthz(_: web.Request) -> web.Response:
        if ready.is_set():
            return web.json_response({"status": "ok", "service": service})
        return web.json_response({"status": "starting", "service": service}, status=503)

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", make_aiohttp_handler(registry))
    return app


async def start_http(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Start ``app`` on ``host:port`` (port 0 picks a free one); return the runner (push its
    ``cleanup`` on the service's exit stack) and the port bound."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    server = site._server  # aiohttp has no public accessor for the bound port
    sockets = getattr(server, "sockets", None) or []
    bound = sockets[0].getsockname()[1] if sockets else port
    return runner, int(bound)
