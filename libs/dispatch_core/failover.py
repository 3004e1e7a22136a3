"""Failover to another cluster (issue 14, part 2): which cluster each submission runs on, and
which clusters' Discoveries a pass of the job must see.

A resubmit rule may list clusters in order (``clusters = ["slurm", "local"]`` in the job
TOML's ``[[policy.rules]]``). When an execution ends with a cause the rule covers and the rule
resubmits, the next submission goes to :func:`next_cluster` of the list after the job's
current cluster:

* the current cluster is in the list: the one after it; the last one stays on the last
  (budget rules as usual: the rule keeps resubmitting there until its budget is spent);
* the current cluster is not in the list (``spec.cluster`` not listed): the first one.

Every other submission stays where the job is: the first one runs on ``spec.cluster``; a
person's resubmit, a submission opened after an abandoned one and a rule without
``clusters`` keep the current cluster. ``SubmissionOpened.cluster`` records the cluster when
it is not ``spec.cluster`` (``None`` means ``spec.cluster``, so every record written before
failover existed reads as it always did).

The epoch keeps rising across clusters: it is ``G*10^12 + N*10^6 + R`` (seed 004) and every
failover opens a new submission N+1, whatever cluster runs it.

An old object on the cluster the job left is still the job's: until the record holds its end
from the scheduler (or it is listed vanished), every pass reads that cluster's Discovery too
(:func:`discovery_clusters`), merged with the current cluster's (:func:`merge_discoveries`),
so the node-loss fence, stops and settling see it as they would on one cluster.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence

from dispatch_core.job import Job, Submission
from dispatch_core.state import Discovery, PlannedRule, RecoveryPolicy

__all__ = [
    "cluster_of",
    "current_cluster",
    "discovery_clusters",
    "failover_cluster",
    "merge_discoveries",
    "next_cluster",
    "policy_clusters",
    "staying_cluster",
]


def cluster_of(job: Job, submission: Submission) -> str:
    """The cluster ``submission`` of ``job`` runs on (its recorded one, else
    ``spec.cluster``)."""
    return submission.cluster or job.spec.cluster


def current_cluster(job: Job) -> str:
    """The cluster of the job's current submission; ``spec.cluster`` before the first one.

    The supervisor launches, opens gates and reads the Discovery of this cluster first.
    """
    sub = job.submission
    return job.spec.cluster if sub is None else cluster_of(job, sub)


def next_cluster(clusters: Sequence[str], current: str) -> str:
    """The cluster after ``current`` in the failover list ``clusters``.

    Args:
        clusters: the rule's failover clusters, in order (not empty).
        current: the cluster the job runs on now.

    Returns:
        The cluster after ``current`` in ``clusters``; the last one when ``current`` is the
        last (a job stays on the last cluster); the first one when ``current`` is not listed.
        Always a member of ``clusters``.

    Raises:
        ValueError: ``clusters`` is empty.
    """
    if not clusters:
        raise ValueError("next_cluster: no clusters to fail over to")
    if current not in clusters:
        return clusters[0]
    i = clusters.index(current)
    return clusters[min(i + 1, len(clusters) - 1)]


def failover_cluster(job: Job, rule: PlannedRule | None) -> str | None:
    """The cluster of the submission a recovery by ``rule`` opens, as
    ``SubmissionOpened.cluster``: :func:`next_cluster` of the rule's list after the current
    cluster when the rule lists clusters, else the current cluster; ``None`` when that is
    ``spec.cluster`` (the record then reads as before failover existed)."""
    current = current_cluster(job)
    target = current if rule is None or not rule.clusters else next_cluster(rule.clusters, current)
    return None if target == job.spec.cluster else target


def staying_cluster(job: Job) -> str | None:
    """``SubmissionOpened.cluster`` of a submission that stays where the job is (a person's
    resubmit, the one after an abandoned submission): the current cluster, ``None`` when it
    is ``spec.cluster``."""
    current = current_cluster(job)
    return None if current == job.spec.cluster else current


def discovery_clusters(job: Job) -> tuple[str, ...]:
    """The clusters whose Discovery a pass (or a projection) of ``job`` reads: the current
    cluster first, then, in record order, every other cluster where the job has an object
    whose end the record doesn't hold from the scheduler, or a launch of unknown outcome."""
    clusters = [current_cluster(job)]
    for record in job.unconfirmed_objects():
        if record.ref.cluster not in clusters:
            clusters.append(record.ref.cluster)
    for sub in job.unknown_submissions():
        cluster = cluster_of(job, sub)
        if cluster not in clusters:
            clusters.append(cluster)
    return tuple(clusters)


def merge_discoveries(discoveries: Sequence[Discovery]) -> Discovery | None:
    """One Discovery of a job from the Discoveries of several clusters.

    Args:
        discoveries: the job's Discoveries, the current cluster's first when there is one
            (the order of :func:`discovery_clusters`, missing ones left out).

    Returns:
        ``None`` for none; the one itself for one; else the first one's ``cluster`` and
        ``seen_at``, every object and vanished ref of all of them, the other clusters in
        ``merged``, and the ``pub/`` reading read last (every cluster reads the same root).

    Raises:
        ValueError: the Discoveries are of different jobs.
    """
    if not discoveries:
        return None
    first = discoveries[0]
    if len(discoveries) == 1:
        return first
    if any(d.job_id != first.job_id for d in discoveries):
        raise ValueError("merge_discoveries: Discoveries of different jobs")
    readings = [d.publications for d in discoveries if d.publications is not None]
    return Discovery(
        cluster=first.cluster,
        job_id=first.job_id,
        seen_at=first.seen_at,
        objects=tuple(o for d in discoveries for o in d.objects),
        vanished=tuple(r for d in discoveries for r in d.vanished),
        publications=max(readings, key=lambda r: r.read_at) if readings else None,
        merged=tuple(d.cluster for d in discoveries[1:] if d.cluster != first.cluster),
    )


def policy_clusters(policy: RecoveryPolicy) -> tuple[str, ...]:
    """Every cluster the policy's rules fail over to, in order of first mention (the API
    checks each exists, accepts the spec and sees its checkpoint root)."""
    seen: list[str] = []
    for rule in policy.rules:
        for cluster in rule.clusters:
            if cluster not in seen:
                seen.append(cluster)
    return tuple(seen)
