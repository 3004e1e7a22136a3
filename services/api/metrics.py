"""The API service's Prometheus metrics, on a registry the service creates and passes in (so
each test gets a fresh one)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["ApiMetrics"]


class ApiMetrics:
    """The API's metrics.

    Attributes:
        requests: HTTP requests by route (the route's pattern, ``unmatched`` for none),
            method and status.
        latency: request durations by route and method, in seconds (an SSE stream counts
            until it ends).
        commands: operator commands and submissions by command and outcome: ``committed``,
            ``replayed`` (an ``Idempotency-Key`` retry), ``refused`` (409), ``forbidden``,
            ``invalid``, ``not-found``, ``busy``, ``error``.
        conflicts: races lost to another writer of the same record, each decided again.
        sse_streams: SSE status streams open now.
        sse_events: statuses sent on SSE streams.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        """Register the metrics on ``registry``."""
        self.requests = Counter(
            "dispatch_api_requests",
            "HTTP requests by route, method and status",
            ["route", "method", "status"],
            registry=registry,
        )
        self.latency = Histogram(
            "dispatch_api_request_seconds",
            "HTTP request durations by route and method",
            ["route", "method"],
            registry=registry,
        )
        self.commands = Counter(
            "dispatch_api_commands",
            "Submissions and operator commands by command and outcome",
            ["command", "outcome"],
            registry=registry,
        )
        self.conflicts = Counter(
            "dispatch_api_command_conflicts",
            "Commands that lost a race to another writer of the record and were decided again",
            ["command"],
            registry=registry,
        )
        self.sse_streams = Gauge(
            "dispatch_api_sse_streams", "SSE status streams open now", registry=registry
        )
        self.sse_events = Counter(
            "dispatch_api_sse_events", "Statuses sent on SSE streams", registry=registry
        )
