"""The overlap harness: an old execution publishes late while its replacement runs (seed 004).

The seed's scenario: when dispatch starts a replacement, the old run may still be writing.
In each trial, an *old* execution (epoch ``G*10**12 + 1*10**6``) has published step 100. It
saves step 200 and starts publishing it, then stalls mid-publication, just before the
store's exclusive create. A *replacement* (next submission: a higher epoch) starts, resumes
from ``latest()`` (reading the old save), saves step 150 (a lower step than the old run's
late save) and publishes it. The old run resumes at a point that moves from trial to trial
(before the replacement resumes, after it resumes, after it saves, right after it
publishes, a little later) and completes its publication. Every ``latest()`` that starts
after the replacement's publication returned must be the replacement's lineage; a trial
where one is not is *lost*.

The seed's figure: the append-only design lost 0 of 40 trials; a design that checked, then
renamed a pointer into place, lost 4 of 40. :func:`run_trials` runs either design over any
:class:`~dispatch_ckpt.store.Store` (the check-then-rename one only to show the harness
catches the failure it exists for).

    result = run_trials(lambda i: PosixStore(tmp / f"t{i}"), 1000)
    assert result.lost == 0
"""

from __future__ import annotations

import enum
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Final, Protocol

import msgspec

from dispatch_ckpt.checkpoints import Checkpoints
from dispatch_ckpt.env import ExecutionEnv
from dispatch_ckpt.names import Publication
from dispatch_ckpt.store import Listing, Store, WalkEntry
from dispatch_core.epoch import epoch

__all__ = ["Design", "OverlapResult", "Stage", "run_trial", "run_trials"]

OLD_EPOCH: Final = epoch(0, 1, 0)
NEW_EPOCH: Final = epoch(0, 2, 0)
_PUBLISHED_STEP: Final = 100
_LATE_STEP: Final = 200
_NEW_STEP_DELTA: Final = 50
_READS_AFTER_PUBLISH: Final = 2
_POINTER: Final = "LATEST"
_WAIT_S: Final = 60.0


class Design(enum.StrEnum):
    """How a save is published."""

    APPEND_ONLY = "append-only"
    """Seed 004: an exclusive create of ``pub/<epoch>-<step>-<path>``; latest by listing."""
    CHECK_THEN_RENAME = "check-then-rename"
    """The rejected design: read a pointer, and if the save is newer, rename a new pointer
    over it. Kept only to show the harness catches the failure it exists for."""


class Stage(enum.IntEnum):
    """When the stalled old execution resumes its publication, relative to the replacement."""

    BEFORE_RESUME = 0
    AFTER_RESUME = 1
    AFTER_SAVE = 2
    AFTER_PUBLISH = 3
    LATER = 4


class OverlapResult(msgspec.Struct, frozen=True, kw_only=True):
    """What a run of trials found."""

    design: Design
    trials: int
    lost: int
    """Trials in which a ``latest()`` begun after the replacement published returned the old
    lineage."""
    late: int
    """Trials in which the old execution's publication completed after the replacement's."""
    seconds: float
    """Wall time of the run."""


class _Stalled:
    """A store whose exclusive create first waits for ``stall()`` (the old run's pause)."""

    def __init__(self, inner: Store, stall: Callable[[], None]) -> None:
        self._inner = inner
        self._stall = stall

    @property
    def root(self) -> str:
        return self._inner.root

    def location(self, relpath: str) -> str:
        return self._inner.location(relpath)

    def relpath(self, location: str) -> str:
        return self._inner.relpath(location)

    def make_dir(self, relpath: str) -> str:
        return self._inner.make_dir(relpath)

    def exists(self, relpath: str) -> bool:
        return self._inner.exists(relpath)

    def create_entry(self, name: str) -> None:
        self._stall()
        self._inner.create_entry(name)

    def list_entries(self) -> Listing:
        return self._inner.list_entries()

    def walk(self, relpath: str) -> Iterator[WalkEntry]:
        return self._inner.walk(relpath)

    def read_bytes(self, relpath: str) -> bytes | None:
        return self._inner.read_bytes(relpath)

    def write_bytes(self, relpath: str, data: bytes) -> None:
        self._inner.write_bytes(relpath, data)


class _Execution(Protocol):
    def save(self, step: int) -> str: ...
    def publish(self, step: int, relpath: str, stall: Callable[[], None]) -> None: ...
    def latest(self) -> tuple[int, int, str] | None: ...
    def read(self, relpath: str) -> bytes | None: ...


class _AppendOnly:
    """One execution using the real :class:`Checkpoints` (seed 004)."""

    def __init__(self, store: Store, attempt: str, epoch_: int) -> None:
        self._store = store
        self._env = ExecutionEnv(attempt=attempt, epoch=epoch_)
        self._ckpt = Checkpoints(store, self._env)

    def save(self, step: int) -> str:
        relpath = f"{self._ckpt.exec_relpath()}/step-{step}.pt"
        self._store.write_bytes(relpath, f"{self._env.epoch}:{step}".encode())
        return relpath

    def publish(self, step: int, relpath: str, stall: Callable[[], None]) -> None:
        Checkpoints(_Stalled(self._store, stall), self._env).publish_relpath(step, relpath)

    def latest(self) -> tuple[int, int, str] | None:
        pub: Publication | None = self._ckpt.latest()
        return None if pub is None else (pub.epoch, pub.step, pub.path)

    def read(self, relpath: str) -> bytes | None:
        return self._store.read_bytes(relpath)


class _CheckThenRename:
    """The rejected design: a pointer file, checked then replaced by rename."""

    def __init__(self, store: Store, attempt: str, epoch_: int) -> None:
        self._store = store
        self._attempt = attempt
        self._epoch = epoch_

    def save(self, step: int) -> str:
        relpath = f"exec/{self._attempt}/step-{step}.pt"
        self._store.write_bytes(relpath, f"{self._epoch}:{step}".encode())
        return relpath

    def publish(self, step: int, relpath: str, stall: Callable[[], None]) -> None:
        current = self.latest()
        if current is not None and current[:2] >= (self._epoch, step):
            return  # the pointer is already newer: nothing to do
        stall()  # between the check and the rename: where an old run can pause
        self._store.write_bytes(_POINTER, f"{self._epoch} {step} {relpath}".encode())

    def latest(self) -> tuple[int, int, str] | None:
        raw = self._store.read_bytes(_POINTER)
        if raw is None:
            return None
        ep, step, path = raw.decode().split(" ", 2)
        return int(ep), int(step), path

    def read(self, relpath: str) -> bytes | None:
        return self._store.read_bytes(relpath)


def _execution(design: Design, store: Store, attempt: str, epoch_: int) -> _Execution:
    if design is Design.APPEND_ONLY:
        return _AppendOnly(store, attempt, epoch_)
    return _CheckThenRename(store, attempt, epoch_)


class _Trial(msgspec.Struct, frozen=True, kw_only=True):
    lost: bool
    late: bool


def run_trial(store: Store, stage: Stage, *, design: Design, jitter_s: float = 0.0) -> bool:
    """Run one trial on a fresh root; return whether it was lost.

    Args:
        store: an empty root.
        stage: when the stalled old execution resumes its publication.
        design: the publication design under test.
        jitter_s: a further pause before the old execution resumes, in seconds.

    Raises:
        CkptError: the store failed (a harness failure, not a lost trial).
        RuntimeError: a thread didn't finish within a minute, or the replacement couldn't
            resume from the old execution's save.
    """
    return _run_trial(store, stage, design=design, jitter_s=jitter_s).lost


def _run_trial(store: Store, stage: Stage, *, design: Design, jitter_s: float) -> _Trial:
    old = _execution(design, store, "old", OLD_EPOCH)
    new = _execution(design, store, "new", NEW_EPOCH)
    old.publish(_PUBLISHED_STEP, old.save(_PUBLISHED_STEP), stall=lambda: None)

    reached = [threading.Event() for _ in Stage]
    old_done = threading.Event()
    new_published_at: list[float] = []
    old_published_at: list[float] = []
    reads_after: list[tuple[int, int, str] | None] = []
    errors: list[BaseException] = []

    def stall() -> None:
        if not reached[stage].wait(_WAIT_S):
            raise RuntimeError(f"overlap trial: stage {stage.name} never reached")
        if jitter_s:
            time.sleep(jitter_s)

    def run_old() -> None:
        try:
            old.publish(_LATE_STEP, old.save(_LATE_STEP), stall=stall)
            old_published_at.append(time.monotonic())
        except BaseException as err:
            errors.append(err)
        finally:
            old_done.set()

    def run_new() -> None:
        try:
            reached[Stage.BEFORE_RESUME].set()
            resume = new.latest()
            if resume is None or new.read(resume[2]) is None:
                raise RuntimeError(f"overlap trial: the replacement can't resume from {resume}")
            reached[Stage.AFTER_RESUME].set()
            step = resume[1] + _NEW_STEP_DELTA if resume[1] < _LATE_STEP else _LATE_STEP - 1
            relpath = new.save(step)
            reached[Stage.AFTER_SAVE].set()
            new.publish(step, relpath, stall=lambda: None)
            new_published_at.append(time.monotonic())
            reached[Stage.AFTER_PUBLISH].set()
            for _ in range(_READS_AFTER_PUBLISH):
                reads_after.append(new.latest())
            reached[Stage.LATER].set()
            if not old_done.wait(_WAIT_S):
                raise RuntimeError("overlap trial: the old execution never finished")
            reads_after.append(new.latest())
        except BaseException as err:
            errors.append(err)
        finally:
            for event in reached:
                event.set()  # never leave the old thread waiting on a failed replacement

    threads = [threading.Thread(target=run_old), threading.Thread(target=run_new)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(_WAIT_S * 2)
        if thread.is_alive():
            raise RuntimeError("overlap trial: a thread is stuck")
    if errors:
        raise errors[0]
    lost = any(read is None or read[0] != NEW_EPOCH for read in reads_after)
    late = bool(old_published_at and new_published_at and old_published_at[0] > new_published_at[0])
    return _Trial(lost=lost, late=late)


def run_trials(
    make_store: Callable[[int], Store],
    trials: int,
    *,
    design: Design = Design.APPEND_ONLY,
    seed: int = 0,
    max_jitter_s: float = 0.0005,
) -> OverlapResult:
    """Run ``trials`` overlap trials, each on its own fresh root.

    Stages cycle through :class:`Stage` so every interleaving is covered equally; a random
    jitter (seeded) moves the old execution's resumption around within each stage.

    Args:
        make_store: returns an empty root for trial ``i``.
        trials: how many trials.
        design: the publication design under test.
        seed: the jitter's random seed.
        max_jitter_s: the largest extra pause of the old execution, in seconds.

    Raises:
        CkptError, RuntimeError: see :func:`run_trial`.
    """
    rng = random.Random(seed)
    stages = list(Stage)
    lost = late = 0
    start = time.perf_counter()
    for i in range(trials):
        trial = _run_trial(
            make_store(i),
            stages[i % len(stages)],
            design=design,
            jitter_s=rng.uniform(0, max_jitter_s),
        )
        lost += trial.lost
        late += trial.late
    return OverlapResult(
        design=design,
        trials=trials,
        lost=lost,
        late=late,
        seconds=time.perf_counter() - start,
    )
