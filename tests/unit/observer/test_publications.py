"""The observer reads jobs' publications (issue 14, part 1): the ``pub/`` listing of a POSIX
root through ``dispatch_ckpt`` (never the checkpoint), in the poll that first shows an
execution ended, and every ``progress_every`` polls while the job lives; the latest epoch and
step go in the Discovery."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

import msgspec
import pytest
from prometheus_client import CollectorRegistry

from dispatch_backends.protocol import Snapshot
from dispatch_ckpt import Checkpoints
from dispatch_core import (
    Cause,
    CauseKind,
    Discovery,
    ObjectPhase,
    ObjectRef,
    ObservedObject,
    Provenance,
    decode,
)
from dispatch_nats import Layout
from services.observer.metrics import ObserverMetrics
from services.observer.progress import PublicationReader
from services.observer.service import Observer

T0 = datetime(2026, 1, 1, tzinfo=UTC)
CLUSTER = "local"
REF = ObjectRef(cluster=CLUSTER, id="1")


class _Backend:
    """A scheduler whose answer the test sets (the observer's only use of a backend)."""

    cluster = CLUSTER

    def __init__(self) -> None:
        self.objects: dict[str, tuple[ObservedObject, ...]] = {}

    async def discover(self, *, expected: tuple[ObjectRef, ...] = ()) -> Snapshot:
        return Snapshot(cluster=CLUSTER, seen_at=T0, objects=dict(self.objects), calls=1)


class _Store:
    """Where Discoveries go (the discovery stream's ``put``)."""

    def __init__(self) -> None:
        self.put_: list[Discovery] = []

    async def put(self, key: tuple[str, str], payload: bytes) -> None:
        self.put_.append(decode(payload, Discovery))


class _Nats:
    async def publish(self, subject: str, payload: bytes) -> None:
        pass


def _obj(phase: ObjectPhase) -> ObservedObject:
    cause = (
        Cause(kind=CauseKind.PREEMPTED, provenance=Provenance.SCHEDULER)
        if phase is ObjectPhase.ENDED
        else None
    )
    return ObservedObject(ref=REF, name="dj-j1", submission=1, attempt=1, phase=phase, cause=cause)


def _publish(root: Path, epoch: int, step: int) -> None:
    ckpt = Checkpoints.open(str(root), {}, attempt="a1", epoch=epoch)
    save = Path(ckpt.exec_dir()) / f"step-{step}"
    save.mkdir()
    ckpt.publish(step, str(save))


def _observer(tmp_path: Path, backend: _Backend, store: _Store, every: int = 3) -> Observer:
    roots = {"j1": str(tmp_path / "{job}")}
    return Observer(
        backend,  # type: ignore[arg-type]
        store,  # type: ignore[arg-type]
        _Nats(),  # type: ignore[arg-type]
        layout=Layout(),
        metrics=ObserverMetrics(CollectorRegistry(), CLUSTER),
        poll_interval_s=1.0,
        publications=PublicationReader(roots.get),
        progress_every=every,
    )


def test_the_poll_that_shows_an_end_carries_the_latest_publication(tmp_path: Path) -> None:
    backend, store = _Backend(), _Store()
    observer = _observer(tmp_path, backend, store, every=1000)
    root = tmp_path / "j1"
    backend.objects = {"j1": (_obj(ObjectPhase.RUNNING),)}
    asyncio.run(observer.poll())
    first = store.put_[-1]
    assert first.publications is None  # a live job isn't read before it's due
    _publish(root, 10**6, 100)
    _publish(root, 10**6, 250)
    backend.objects = {"j1": (_obj(ObjectPhase.ENDED),)}
    asyncio.run(observer.poll())
    pubs = store.put_[-1].publications
    assert pubs is not None
    assert (pubs.epoch, pubs.step, pubs.read_at) == (10**6, 250, T0)


def test_a_live_job_is_read_every_k_polls_and_published_when_it_advanced(
    tmp_path: Path,
) -> None:
    backend, store = _Backend(), _Store()
    observer = _observer(tmp_path, backend, store, every=2)
    root = tmp_path / "j1"
    backend.objects = {"j1": (_obj(ObjectPhase.RUNNING),)}
    asyncio.run(observer.poll())  # poll 1: the object shows; not due
    assert len(store.put_) == 1
    _publish(root, 10**6, 7)
    asyncio.run(observer.poll())  # poll 2: due; a new step publishes the Discovery
    assert len(store.put_) == 2
    pubs = store.put_[-1].publications
    assert pubs is not None
    assert pubs.step == 7
    asyncio.run(observer.poll())  # poll 3: not due, nothing changed
    asyncio.run(observer.poll())  # poll 4: due, the same step: nothing to publish
    assert len(store.put_) == 2


def test_a_root_with_nothing_published_reads_as_nothing_published(tmp_path: Path) -> None:
    backend, store = _Backend(), _Store()
    observer = _observer(tmp_path, backend, store)
    (tmp_path / "j1" / "pub").mkdir(parents=True)
    backend.objects = {"j1": (_obj(ObjectPhase.ENDED),)}
    asyncio.run(observer.poll())
    pubs = store.put_[-1].publications
    assert pubs is not None
    assert (pubs.epoch, pubs.step) == (None, None)


@pytest.mark.parametrize("per_poll", [1, 2])
def test_a_reading_is_bounded_per_poll(tmp_path: Path, per_poll: int) -> None:
    for job in ("a", "b", "c"):
        _publish(tmp_path / job, 10**6, 5)
    reader = PublicationReader(lambda job: str(tmp_path / job), per_poll=per_poll)
    got = asyncio.run(reader.read(["a", "b", "c"], T0))
    assert sorted(got) == ["a", "b", "c"][:per_poll]


def test_a_job_on_a_lost_node_is_read_every_poll(tmp_path: Path) -> None:
    """The node-loss fence may end the execution in any pass: its listing must be current."""
    backend, store = _Backend(), _Store()
    observer = _observer(tmp_path, backend, store, every=1000)
    lost = Cause(kind=CauseKind.NODE_LOST, provenance=Provenance.SCHEDULER)
    running = _obj(ObjectPhase.RUNNING)
    backend.objects = {"j1": (running,)}
    asyncio.run(observer.poll())
    _publish(tmp_path / "j1", 10**6, 40)
    backend.objects = {"j1": (msgspec.structs.replace(running, cause=lost),)}
    asyncio.run(observer.poll())
    pubs = store.put_[-1].publications
    assert pubs is not None
    assert pubs.step == 40
