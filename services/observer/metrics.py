"""The observer's Prometheus metrics, on a registry of its own (one per service instance)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["ObserverMetrics"]


class ObserverMetrics:
    """Every metric the observer exports, registered on ``registry``."""

    def __init__(self, registry: CollectorRegistry, cluster: str) -> None:
        """Register the metrics on ``registry``; ``cluster`` labels them all."""
        labels = ("cluster",)
        self.polls = Counter(
            "dispatch_observer_polls",
            "Polls of the scheduler, by result (reachable or unreachable).",
            (*labels, "result"),
            registry=registry,
        )
        self.poll_duration = Histogram(
            "dispatch_observer_poll_duration_seconds",
            "Time one poll took: the batched discover and the publishing of its changes.",
            labels,
            registry=registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
        )
        self.scheduler_calls = Gauge(
            "dispatch_observer_scheduler_calls_per_poll",
            "Scheduler calls the last poll's discover took (constant as jobs grow).",
            labels,
            registry=registry,
        )
        self.discoveries = Counter(
            "dispatch_observer_discoveries_published",
            "Discoveries published (a job's view changed, or its objects vanished).",
            labels,
            registry=registry,
        )
        self.unreachable = Counter(
            "dispatch_observer_unreachable",
            "Polls that found the scheduler unreachable.",
            labels,
            registry=registry,
        )
        self.reachable = Gauge(
            "dispatch_observer_scheduler_reachable",
            "1 if the last poll reached the scheduler, else 0.",
            labels,
            registry=registry,
        )
        self.jobs = Gauge(
            "dispatch_observer_jobs",
            "Jobs with at least one object on the cluster at the last poll.",
            labels,
            registry=registry,
        )
        self._cluster = cluster

    def observe_poll(
        self, *, reachable: bool, duration_s: float, calls: int, published: int, jobs: int
    ) -> None:
        """Record one poll."""
        c = self._cluster
        self.polls.labels(c, "reachable" if reachable else "unreachable").inc()
        self.poll_duration.labels(c).observe(duration_s)
        self.reachable.labels(c).set(1 if reachable else 0)
        if reachable:
            self.scheduler_calls.labels(c).set(calls)
            self.discoveries.labels(c).inc(published)
            self.jobs.labels(c).set(jobs)
        else:
            self.unreachable.labels(c).inc()
