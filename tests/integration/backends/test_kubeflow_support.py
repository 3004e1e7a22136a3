"""The kubeflow backend's plug-in for the contract suite, and what its scenario tests share.

Everything talks to the lane's real kube-apiserver (``tests/servers/kube.py``) through the real
``kubernetes`` client and the lane's proxy (``tests/servers/kube_proxy.py``, for faults); the
scripted cluster simulator (TEST DOUBLE, ``tests/fakes/kube_controller.py``) plays the Trainer,
JobSet, Job, Kueue and kubelet controllers in a background thread, writing through the same
server. This module holds no tests.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime
from typing import Any, ClassVar

import pytest
from kubernetes import client as k8s

from dispatch_backends import Snapshot
from dispatch_backends.kubeflow import GateMode, KubeflowBackend, KubeflowSettings
from dispatch_backends.kubeflow.names import LABEL_JOB
from dispatch_core.commands import Submit
from dispatch_core.decide import decide
from dispatch_core.events import (
    CessationObserved,
    EscalationDelivered,
    GateOpened,
    JobEvent,
    LaunchRecorded,
)
from dispatch_core.job import Job
from dispatch_core.plan import next_steps
from dispatch_core.state import (
    Actor,
    ActorKind,
    Discovery,
    JobSpec,
    ObjectRef,
    ObservedObject,
    RecoveryPolicy,
)
from dispatch_core.steps import AskCessation, Deliver, Launch, OpenGate, Pass, Step, Stop
from tests.contract.backend_contract import FAIL_EXIT_CODE, BackendHarness, Program
from tests.fakes.kube_controller import ClusterSimulator, train_job_body
from tests.servers.kube import KubeApiServer
from tests.servers.kube_lane import RealKube
from tests.servers.kube_resources import TRAINJOBS
from tests.unit.core.helpers import Record, decisions
from tests.unit.kubeflow.records import container_env
from tests.util import assert_eventually

__all__ = [
    "CLUSTER",
    "NS",
    "QUEUE",
    "KubeflowHarness",
    "Supervisor",
    "container_env",
    "real_kube_env",
    "real_simulated",
]

CLUSTER = "test-kubeflow"
NS = "team-a"
QUEUE = "lq"
IMAGE = "ghcr.io/example/train:1"


class KubeflowHarness(BackendHarness):
    """A :class:`KubeflowBackend` on the lane's server, with the simulator running.

    ``tick`` plays each contract program: a TrainJob whose trainer command is
    ``("contract", "succeed")`` succeeds once its pods run, ``"fail"`` exits
    :data:`FAIL_EXIT_CODE`, ``"sleep"`` runs until stopped.
    """

    settle_timeout_s: ClassVar[float] = 30.0
    stop_cause: ClassVar[None] = None  # a stopped TrainJob is deleted: it simply disappears

    def __init__(
        self,
        server: RealKube,
        cluster: ClusterSimulator,
        gate: GateMode = GateMode.KUEUE,
        **settings: Any,
    ) -> None:
        super().__init__()
        self.server = server
        self.cluster = cluster
        self.api = server.api_client()
        for key, value in server.harness_settings.items():
            settings.setdefault(key, value)
        settings.setdefault("namespaces", (NS,))
        settings.setdefault("queue", QUEUE if gate is GateMode.KUEUE else "")
        settings.setdefault("watch_timeout_s", 1.0)
        settings.setdefault("node_loss_window_s", 5.0)
        self.settings = KubeflowSettings(gate=gate, **settings)
        self._backend = KubeflowBackend(CLUSTER, self.settings, self.api)
        self._played: set[str] = set()

    @property
    def backend(self) -> KubeflowBackend:
        return self._backend

    def spec(
        self,
        program: Program,
        *,
        checkpoint: str | None = None,
        options: Mapping[str, str] | None = None,
    ) -> JobSpec:
        return JobSpec(
            cluster=CLUSTER,
            command=("contract", program.value),
            checkpoint=checkpoint,
            options={"image": IMAGE, "nodes": "2", **(options or {})},
        )

    def trainjob(self, ref: ObjectRef) -> dict[str, Any] | None:
        """The TrainJob at ``ref`` on the server (``None`` when gone)."""
        namespace, _, name = ref.id.partition("/")
        return self.server.store.find(TRAINJOBS, namespace, name)

    def pods(self, ref: ObjectRef) -> list[dict[str, Any]]:
        """The pods of ``ref`` on the server."""
        namespace, _, name = ref.id.partition("/")
        return self.cluster.pods(namespace, name)

    async def execution_env(self, ref: ObjectRef) -> Mapping[str, str] | None:
        for pod in self.pods(ref):
            statuses = pod.get("status", {}).get("containerStatuses") or ()
            if any("running" in s["state"] or "terminated" in s["state"] for s in statuses):
                env = container_env(pod)
                return {k: v for k, v in env.items() if k.startswith("DISPATCH_")}
        return None

    async def inject_foreign(self, job_id: str) -> None:
        """What a person might do: create ``dj-<job>`` by hand, labelled for the job (so it is
        seen) but without submission and attempt."""
        body = train_job_body(f"dj-{job_id}", labels={LABEL_JOB: job_id}, suspend=True)
        custom = k8s.CustomObjectsApi(self.api)
        await asyncio.to_thread(
            custom.create_namespaced_custom_object,
            TRAINJOBS.group,
            TRAINJOBS.version,
            NS,
            TRAINJOBS.plural,
            body,
        )

    async def forget(self, ref: ObjectRef) -> None:
        """Delete the ended TrainJob, as its TTL or a person would."""
        namespace, _, name = ref.id.partition("/")
        custom = k8s.CustomObjectsApi(self.api)
        await asyncio.to_thread(
            custom.delete_namespaced_custom_object,
            TRAINJOBS.group,
            TRAINJOBS.version,
            namespace,
            TRAINJOBS.plural,
            name,
        )

        async def deleted() -> None:
            assert self.trainjob(ref) is None, f"{ref} still in the API server"

        await assert_eventually(deleted, timeout_s=self.settle_timeout_s)

    def never_made(self) -> ObjectRef:
        return ObjectRef(cluster=CLUSTER, id=f"{NS}/dj-never-made")

    def unreachable(self) -> AbstractAsyncContextManager[None]:
        @contextlib.asynccontextmanager
        async def outage() -> AsyncIterator[None]:
            with self.server.outage():
                yield

        return outage()

    async def tick(self) -> None:
        await asyncio.to_thread(self.play)

    def play(self) -> None:
        """Carry out the contract programs of TrainJobs whose pods all run."""
        items, _, _ = self.server.store.list_objects(TRAINJOBS, NS)
        for tj in items:
            name = tj["metadata"]["name"]
            command = (tj["spec"].get("trainer") or {}).get("command") or []
            if name in self._played or command[:1] != ["contract"]:
                continue
            pods = self.cluster.pods(NS, name)
            want = int(tj["spec"]["trainer"].get("numNodes", 1))
            running = [p for p in pods if p["status"].get("phase") == "Running"]
            if len(running) < want or tj["metadata"].get("deletionTimestamp"):
                continue
            if command[1] == Program.SUCCEED.value:
                self._played.add(name)
                self.cluster.succeed(NS, name)
            elif command[1] == Program.FAIL.value:
                self._played.add(name)
                self.cluster.fail(NS, name, exit_code=FAIL_EXIT_CODE)

    async def cleanup(self) -> None:
        await self._backend.aclose()
        self.api.close()


@contextlib.contextmanager
def real_simulated(
    lab: KubeApiServer, *, token: str | None = None, **options: Any
) -> Iterator[tuple[RealKube, ClusterSimulator]]:
    """The lane's real kube-apiserver (namespace :data:`NS`, emptied before and after) and the
    simulator writing through it, reacting in the background; ``token`` is the backend's
    (the admin's by default). The simulator's background errors are asserted at the end."""
    env = RealKube(lab, NS, token=token)
    try:
        cluster = ClusterSimulator(env.store, **options)
        cluster.start()
        try:
            yield env, cluster
        finally:
            cluster.stop()
        assert not cluster.errors, f"cluster simulator failed: {cluster.errors!r}"
    finally:
        env.close()


@pytest.fixture
def real_kube_env(
    kube_lab: KubeApiServer, kube_dispatch_token: str
) -> Iterator[tuple[RealKube, ClusterSimulator]]:
    """:func:`real_simulated` with the simulator's defaults; the backend runs as the
    ServiceAccount of ``deploy/kubernetes`` (its token, its RBAC), so every operation the
    tests make it perform is one that RBAC allows."""
    with real_simulated(kube_lab, token=kube_dispatch_token) as env:
        yield env


class Supervisor:
    """A small supervisor over the real planner (``dispatch_core.next_steps``) and the
    backend: one pass = discover, plan, append the decisions, carry the actions out and
    append their results (as ``tests/unit/core/helpers.py``'s ``Sim`` does, with the real
    scheduler in place of a dict)."""

    def __init__(self, harness: KubeflowHarness, job_id: str, spec: JobSpec, *rules: Any) -> None:
        self.harness = harness
        self.job_id = job_id
        self.declarations = harness.backend.declarations()
        events = decide(
            None,
            Submit(
                by=Actor(name="alice", kind=ActorKind.HUMAN),
                job_id=job_id,
                spec=spec,
                policy=RecoveryPolicy(rules=tuple(rules)),
                declarations=self.declarations,
            ),
            datetime.now(UTC),
        )
        self.record = Record(events[0])  # type: ignore[arg-type]
        self.passes: list[Pass] = []
        self.snapshot: Snapshot | None = None
        # What the observer keeps across polls (issue 15, "gone is not ended"): the objects
        # it last saw alive (expected), the ends it showed, the objects that vanished.
        self._expected: set[ObjectRef] = set()
        self._ended: dict[ObjectRef, ObservedObject] = {}
        self._vanished: list[ObjectRef] = []

    @property
    def job(self) -> Job:
        return self.record.job(datetime.now(UTC))

    def current(self) -> ObservedObject | None:
        """The current submission's object as last discovered."""
        sub = self.job.submission
        if self.snapshot is None or sub is None:
            return None
        return next(
            (
                o
                for o in self.snapshot.objects.get(self.job_id, ())
                if o.submission == sub.number and o.alive
            ),
            None,
        )

    async def step(self) -> Pass:
        """One pass (see the class docstring); returns it."""
        self.snapshot = await self.harness.discover(expected=self._expected)
        shown = self.snapshot.objects.get(self.job_id, ())
        listed = {o.ref for o in shown}
        self._ended.update((o.ref, o) for o in shown if not o.alive)
        self._vanished += [r for r in self.snapshot.vanished if r not in self._vanished]
        self._expected = {o.ref for o in shown if o.alive and not o.foreign}
        discovery = Discovery(
            cluster=self.snapshot.cluster,
            job_id=self.job_id,
            seen_at=self.snapshot.seen_at,
            objects=(*shown, *(o for r, o in self._ended.items() if r not in listed)),
            vanished=tuple(r for r in self._vanished if r not in listed),
        )
        now = datetime.now(UTC)
        the_pass = next_steps(self.job, discovery, self.declarations, now)
        self.passes.append(the_pass)
        self.record.append(decisions(the_pass))
        results: list[JobEvent] = []
        backend = self.harness.backend
        for step in the_pass.steps:
            match step:
                case Launch():
                    ref = await backend.start(step)
                    self.harness.started.append(ref)
                    results.append(
                        LaunchRecorded(
                            job_id=self.job_id,
                            at=now,
                            submission=step.submission,
                            attempt=step.attempt,
                            ref=ref,
                        )
                    )
                case OpenGate():
                    await backend.open_gate(step.ref)
                    results.append(GateOpened(job_id=self.job_id, at=now, ref=step.ref))
                case Stop():
                    if step.intent.emergency:
                        await backend.emergency_stop(step.ref)
                    else:
                        await backend.stop(step.ref)
                case AskCessation():
                    answer = await backend.cessation(step.ref, step.nodes)
                    results.append(
                        CessationObserved(
                            job_id=self.job_id,
                            at=now,
                            ref=step.ref,
                            ceased=answer.ceased,
                            detail=answer.detail,
                        )
                    )
                case Deliver():
                    results.extend(
                        EscalationDelivered(job_id=self.job_id, at=now, id=e.id)
                        for e in step.escalations
                    )
                case _:
                    pass
        self.record.append(results)
        return the_pass

    def steps_of(self, the_pass: Pass, kind: type[Step]) -> list[Step]:
        """The steps of ``the_pass`` of one kind."""
        return [s for s in the_pass.steps if isinstance(s, kind)]
