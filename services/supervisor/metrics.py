"""The supervisor's Prometheus metrics, on a registry of its own (one per service instance)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from dispatch_core import State

__all__ = ["SupervisorMetrics"]


class SupervisorMetrics:
    """Every metric a supervisor replica exports, registered on ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        """Register the metrics on ``registry``."""
        self.passes = Counter(
            "dispatch_supervisor_passes",
            "Passes run, by result: ok, retry (an action or the store failed; it runs again), "
            "poison (the record can't be read) or error (a bug).",
            ("result",),
            registry=registry,
        )
        self.poison = Counter(
            "dispatch_supervisor_unreadable_records",
            "Passes that found a job's record unreadable and left the job alone (issue 10), "
            "by why: undecodable (an event does not decode), writer (its writer may not write "
            "it) or malformed (a history dispatch could not have written).",
            ("why",),
            registry=registry,
        )
        self.pass_duration = Histogram(
            "dispatch_supervisor_pass_duration_seconds",
            "Time one pass took: read, plan, commit, carry out, publish the status.",
            registry=registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0),
        )
        self.steps = Counter(
            "dispatch_supervisor_steps",
            "Planner steps carried out, by kind.",
            ("kind",),
            registry=registry,
        )
        self.launches = Counter(
            "dispatch_supervisor_launches",
            "Backend starts, by outcome: recorded, refused or unknown.",
            ("outcome",),
            registry=registry,
        )
        self.escalations = Counter(
            "dispatch_supervisor_escalations",
            "Escalations committed by this replica, by kind (the id's prefix).",
            ("kind",),
            registry=registry,
        )
        self.recoveries = Counter(
            "dispatch_supervisor_recoveries",
            "Submissions opened by a recovery rule, by the cause kind that ended the "
            "execution before (preempted, node-lost, time-limit, ...).",
            ("cause",),
            registry=registry,
        )
        self.delivered = Counter(
            "dispatch_supervisor_escalations_delivered",
            "Escalations delivered in-process, by result (ok or error).",
            ("result",),
            registry=registry,
        )
        self.conflicts = Counter(
            "dispatch_supervisor_conflicts",
            "Optimistic-concurrency conflicts, by what was appended: decision (re-planned), "
            "fact (appended again) or status.",
            ("what",),
            registry=registry,
        )
        self.jobs = Gauge(
            "dispatch_supervisor_jobs",
            "Jobs by state, from the latest Status of each job.",
            ("state",),
            registry=registry,
        )
        self.wakes = Counter(
            "dispatch_supervisor_wakes_published",
            "Pass requests published to the work stream, by why: deadline, catch-up, retry.",
            ("why",),
            registry=registry,
        )
        self.deliveries = Counter(
            "dispatch_supervisor_deliveries",
            "Messages received from the shared consumers, by source: record, discovery, work.",
            ("source",),
            registry=registry,
        )
        for state in State:
            self.jobs.labels(state.value).set(0)
