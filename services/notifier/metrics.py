"""The notifier's Prometheus metrics, on a registry created per service (one per test).

* ``dispatch_notifier_deliveries_total{channel, outcome}``: attempts to hand an escalation to
  a channel, by outcome (``accepted``, ``failed``, ``rejected``).
* ``dispatch_notifier_delivery_seconds{channel}``: how long each attempt took.
* ``dispatch_notifier_retries_total``: escalations put back for another try (after a backoff).
* ``dispatch_notifier_recorded_total{by}``: deliveries recorded in a job's record, ``by`` this
  notifier (``self``) or found recorded by another writer (``other``).
* ``dispatch_notifier_channel_consecutive_failures{channel}``: failed attempts on a channel
  since its last accepted one: a permanently failing channel keeps climbing.
* ``dispatch_notifier_undelivered``: escalations committed to a record and not delivered, over
  every job (from the records, refreshed every ``audit_interval_s``; each replica reports the
  same number, so aggregate with ``max``).
* ``dispatch_notifier_oldest_undelivered_age_seconds``: age of the oldest of them (0 if none).
* ``dispatch_notifier_errors_total{kind}``: events that can't be handled (``undecodable``,
  ``malformed-record``), store errors (``store``), unexpected errors (``bug``).
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["NotifierMetrics"]


class NotifierMetrics:
    """Every metric of one notifier, registered on ``registry``."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        undelivered: Callable[[], float],
        oldest_age_s: Callable[[], float],
    ) -> None:
        """Register the metrics; the two gauges read ``undelivered`` and ``oldest_age_s`` at
        scrape time."""
        self.deliveries = Counter(
            "dispatch_notifier_deliveries",
            "Attempts to hand an escalation to a channel, by outcome.",
            ["channel", "outcome"],
            registry=registry,
        )
        self.delivery_seconds = Histogram(
            "dispatch_notifier_delivery_seconds",
            "Duration of one attempt to hand an escalation to a channel.",
            ["channel"],
            registry=registry,
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
        )
        self.retries = Counter(
            "dispatch_notifier_retries",
            "Escalations put back for another delivery attempt after a failure.",
            registry=registry,
        )
        self.recorded = Counter(
            "dispatch_notifier_recorded",
            "Deliveries recorded in a job's record, by this notifier or found recorded.",
            ["by"],
            registry=registry,
        )
        self.consecutive_failures = Gauge(
            "dispatch_notifier_channel_consecutive_failures",
            "Failed attempts on a channel since it last accepted an escalation.",
            ["channel"],
            registry=registry,
        )
        self.errors = Counter(
            "dispatch_notifier_errors",
            "Record events that can't be handled, store errors and unexpected errors.",
            ["kind"],
            registry=registry,
        )
        self.undelivered = Gauge(
            "dispatch_notifier_undelivered",
            "Escalations committed to a record and not yet delivered (every job).",
            registry=registry,
        )
        self.undelivered.set_function(undelivered)
        self.oldest_undelivered_age = Gauge(
            "dispatch_notifier_oldest_undelivered_age_seconds",
            "Age of the oldest escalation not yet delivered, 0 if none.",
            registry=registry,
        )
        self.oldest_undelivered_age.set_function(oldest_age_s)

    def channel_result(self, channel: str, outcome: str, seconds: float) -> None:
        """Count one attempt on ``channel`` that ended with ``outcome`` after ``seconds``."""
        self.deliveries.labels(channel, outcome).inc()
        self.delivery_seconds.labels(channel).observe(seconds)
        if outcome == "accepted":
            self.consecutive_failures.labels(channel).set(0)
        else:
            self.consecutive_failures.labels(channel).inc()
