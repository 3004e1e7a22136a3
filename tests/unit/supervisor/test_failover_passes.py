"""The supervisor carries out a failover (issue 14, part 2) on in-memory ports: the launch of
a submission a failover rule opened goes to that submission's cluster's backend, the pass
reads both clusters' Discoveries (the old object's end from the cluster it left), and a
failover to a cluster this replica has no backend for is refused before any intent."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from prometheus_client import CollectorRegistry

from dispatch_core import (
    Actor,
    ActorKind,
    Cause,
    CauseKind,
    Discovery,
    GateState,
    JobSpec,
    LaunchIntended,
    ObjectPhase,
    ObjectRef,
    ObservedObject,
    Provenance,
    RecoveryPolicy,
    Status,
    Submit,
    WriterKind,
    decide,
    decode,
    decode_event,
    encode,
)
from services.supervisor.metrics import SupervisorMetrics
from services.supervisor.passes import PassExecutor, UnknownCluster
from tests.contract.record_fake import FakeRecordStream
from tests.unit.core.helpers import rule
from tests.unit.supervisor.fakes import FakeBackend, FakeLatest
from tests.util import writer_of

JOB = "job-1"
FIRST, SECOND = "fake", "other"
ALICE = Actor(name="alice", kind=ActorKind.HUMAN)
NODE_LOST = Cause(kind=CauseKind.NODE_LOST, provenance=Provenance.SCHEDULER, detail="NODE_FAIL")


class Ports:
    def __init__(self) -> None:
        self.stream = FakeRecordStream()
        self.discoveries = FakeLatest()
        self.statuses = FakeLatest()
        self.backends = {FIRST: FakeBackend(FIRST), SECOND: FakeBackend(SECOND)}
        policy = RecoveryPolicy(rules=(rule(CauseKind.NODE_LOST, clusters=[FIRST, SECOND]),))
        events = decide(
            None,
            Submit(
                by=ALICE,
                job_id=JOB,
                spec=JobSpec(cluster=FIRST, command=("train",)),
                policy=policy,
                declarations=self.backends[FIRST].declarations(),
            ),
            datetime.now(UTC),
        )
        for event in events:
            self.stream.put(JOB, encode(event), writer_of(event), f"other:{self.stream.seq}")

    def executor(self, *clusters: str) -> PassExecutor:
        return PassExecutor(
            records=self.stream.store(WriterKind.SUPERVISOR),
            discoveries=self.discoveries,
            statuses=self.statuses,
            backends={c: self.backends[c] for c in clusters},
            metrics=SupervisorMetrics(CollectorRegistry()),
        )

    async def show(self, cluster: str, *objects: ObservedObject) -> None:
        discovery = Discovery(
            cluster=cluster, job_id=JOB, seen_at=datetime.now(UTC), objects=objects
        )
        await self.discoveries.put((cluster, JOB), encode(discovery))

    def intents(self) -> list[tuple[int, int]]:
        events = [decode_event(e.payload) for e in self.stream.entries[JOB]]
        return [(e.submission, e.attempt) for e in events if isinstance(e, LaunchIntended)]


def _obj(
    cluster: str, object_id: str, submission: int, phase: ObjectPhase, **kw: object
) -> ObservedObject:
    return ObservedObject(
        ref=ObjectRef(cluster=cluster, id=object_id),
        name=f"dj-{JOB}",
        submission=submission,
        attempt=1,
        phase=phase,
        **kw,  # type: ignore[arg-type]
    )


async def _drain(ex: PassExecutor) -> None:
    while (await ex.run_pass(JOB)).follow_up:
        pass


async def test_a_failover_launches_on_the_next_clusters_backend_and_opens_its_gate() -> None:
    ports = Ports()
    ex = ports.executor(FIRST, SECOND)
    await _drain(ex)
    assert [launch.spec.cluster for launch in ports.backends[FIRST].started] == [FIRST]
    await ports.show(FIRST, _obj(FIRST, "1", 1, ObjectPhase.ENDED, cause=NODE_LOST))
    await _drain(ex)
    (moved,) = ports.backends[SECOND].started
    assert (moved.submission, moved.spec.cluster) == (2, SECOND)
    # The new object shows on the second cluster, its gate closed; the first cluster's
    # Discovery still shows the old one ended: the gate opens.
    await ports.show(SECOND, _obj(SECOND, "1", 2, ObjectPhase.PENDING, gate=GateState.CLOSED))
    await _drain(ex)
    assert ports.backends[SECOND].opened == [ObjectRef(cluster=SECOND, id="1")]
    assert ports.backends[FIRST].opened == []  # never seen pending there
    status = decode(ports.statuses.values[(JOB,)].payload, Status)
    assert (status.cluster, status.submission) == (SECOND, 2)


async def test_a_failover_to_a_cluster_without_a_backend_here_commits_no_intent() -> None:
    ports = Ports()
    ex = ports.executor(FIRST)
    await _drain(ex)
    await ports.show(FIRST, _obj(FIRST, "1", 1, ObjectPhase.ENDED, cause=NODE_LOST))
    with pytest.raises(UnknownCluster, match="'other'"):
        await ex.run_pass(JOB)
    assert ports.intents() == [(1, 1)]
