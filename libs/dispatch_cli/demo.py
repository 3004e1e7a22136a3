"""``dispatch demo``: a real training job preempted, resubmitted by its rule, and resumed from
its latest published checkpoint, on the embedded default.

1. Find the ``dispatch up`` running on the data directory, or start one (its own, in a new
   temporary directory, on a free port; stopped at the end).
2. Submit ``examples/local/train.py`` (a small PyTorch MLP on scikit-learn's digits, CPU)
   on the local cluster with the rules ``resubmit on preempted, node-lost (budget 3)`` and
   ``hold on non-zero-exit, out-of-memory``, and a checkpoint root in the data directory.
3. Watch its Status live (``dispatch watch``'s lines), print the training's own lines
   prefixed with ``|``, and once the first execution has published a third of its
   checkpoints, preempt its object by fault injection (the local backend's ``preempt``:
   SIGTERM, then SIGKILL after the kill wait; cause ``preempted``).
4. When the job settles, print a summary: the committed transitions with their causes,
   each execution (object, submission, ``DISPATCH_EPOCH``, how it ended, the step it resumed
   from), the final loss, and the record's events.

It succeeds (exit 0) when the job succeeded after a preemption and the second execution
resumed from a checkpoint step > 0.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any, Final

import msgspec

from dispatch_cli.client import ApiClient, RecordedEvent
from dispatch_cli.embedded import Embedded, source_root
from dispatch_cli.errors import EXIT_FAILURE, EXIT_OK, CliError, UsageError
from dispatch_cli.home import UpState, default_data_dir, read_state, read_token
from dispatch_cli.program import program
from dispatch_cli.render import cause_text, event_line, plan_lines, transition_line
from dispatch_cli.watching import Watcher
from dispatch_core import (
    ExecutionEnded,
    LaunchRecorded,
    ObjectRef,
    State,
    Status,
)

__all__ = ["DemoSummary", "Execution", "run_demo"]

_RESUMED: Final = re.compile(r"resumed from checkpoint step (\d+)")
_FINAL: Final = re.compile(r"final loss ([0-9.]+)(?: .*accuracy ([0-9.]+))?")
_EPOCH_LINE: Final = re.compile(r"DISPATCH_EPOCH=(\d+)")
_SETTLE_TIMEOUT_S: Final = 600.0


class Execution(msgspec.Struct, frozen=True, kw_only=True):
    """One execution of the demo's job, as the summary shows it."""

    object: str
    submission: int
    epoch: int | None
    ended: str | None
    resumed_from_step: int | None


class DemoSummary(msgspec.Struct, frozen=True, kw_only=True):
    """What ``dispatch demo --json`` prints at the end."""

    job_id: str
    state: State
    seconds: float
    preempted_object: str | None
    history: list[str]
    executions: list[Execution]
    final_loss: float | None
    final_accuracy: float | None
    record: list[str]
    data_dir: str


class _Director(threading.Thread):
    """Print the training's lines as they come, and preempt the first execution once it
    has published ``preempt_after`` checkpoints."""

    def __init__(
        self,
        *,
        local_data_dir: Path,
        ckpt_root: Path,
        preempt_after: int,
        say: Callable[[str], None],
    ) -> None:
        super().__init__(name="dispatch-demo", daemon=True)
        self.local_data_dir = local_data_dir
        self.ckpt_root = ckpt_root
        self.preempt_after = preempt_after
        self.say = say
        self.objects: list[ObjectRef] = []
        self.preempted: ObjectRef | None = None
        self.error: str | None = None
        self._offsets: dict[str, int] = {}
        self._lock = threading.Lock()
        self._stop_event = threading.Event()

    def saw(self, status: Status) -> None:
        """Note the objects a Status names (called by the watcher)."""
        with self._lock:
            for ref in status.objects:
                if ref not in self.objects:
                    self.objects.append(ref)

    def stdout(self, ref: ObjectRef) -> Path:
        """The object's stdout file (the local backend's object folder, or its archive)."""
        live = self.local_data_dir / "objects" / ref.id / "stdout"
        return live if live.exists() else self.local_data_dir / "archive" / ref.id / "stdout"

    def run(self) -> None:
        while not self._stop_event.wait(0.2):
            self._tick()
        self._tick()

    def _tick(self) -> None:
        with self._lock:
            objects = list(self.objects)
        for ref in objects:
            self._follow(ref)
        if self.preempted is None and objects and self.error is None:
            published = self._published()
            if published >= self.preempt_after:
                self._preempt(objects[0], published)

    def _follow(self, ref: ObjectRef) -> None:
        path = self.stdout(ref)
        offset = self._offsets.get(ref.id, 0)
        try:
            with path.open("rb") as f:
                f.seek(offset)
                data = f.read()
        except OSError:
            return
        end = data.rfind(b"\n") + 1
        if end:
            self._offsets[ref.id] = offset + end
            for line in data[:end].decode(errors="replace").splitlines():
                self.say(f"    | {line}")

    def _published(self) -> int:
        try:
            return sum(1 for _ in (self.ckpt_root / "pub").iterdir())
        except OSError:
            return 0

    def _preempt(self, ref: ObjectRef, published: int) -> None:
        from dispatch_backends.local import FaultError, Faults

        self._follow(ref)
        self.say(
            f">>> demo: {published} checkpoints published; preempting object {ref.cluster}/"
            f"{ref.id} (fault injection: the scheduler takes the node back)"
        )
        try:
            Faults(self.local_data_dir).preempt(ref.id)
        except FaultError as err:
            self.error = f"could not preempt {ref.id}: {err}"
            self.say(f">>> demo: {self.error}")
            return
        self.preempted = ref

    def stop(self) -> None:
        self._stop_event.set()
        self.join(5)


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _executions(events: tuple[RecordedEvent, ...], director: _Director) -> list[Execution]:
    ended: dict[str, str] = {}
    for entry in events:
        if isinstance(entry.event, ExecutionEnded):
            ended[entry.event.ref.id] = cause_text(entry.event.cause)
    out = []
    for entry in events:
        event = entry.event
        if not isinstance(event, LaunchRecorded):
            continue
        text = _read(director.stdout(event.ref))
        epoch = _EPOCH_LINE.search(text)
        resumed = _RESUMED.search(text)
        out.append(
            Execution(
                object=f"{event.ref.cluster}/{event.ref.id}",
                submission=event.submission,
                epoch=int(epoch.group(1)) if epoch else None,
                ended=ended.get(event.ref.id),
                resumed_from_step=int(resumed.group(1)) if resumed else None,
            )
        )
    return out


def _find_up(
    data_dir: Path | None, say: Callable[[str], None]
) -> tuple[UpState, str, Embedded | None]:
    """The running ``up`` to use, its token, and the Embedded the demo started (or None)."""
    data = (data_dir or default_data_dir(os.environ)).expanduser()
    state = read_state(data)
    if state is not None:
        token = os.environ.get("DISPATCH_TOKEN") or read_token(data)
        if token is None:
            raise UsageError(f"dispatch up runs on {data} but its token can't be read here")
        if ApiClient(state.api, token).healthy():
            say(f"using the dispatch up running on {data} (API {state.api})")
            return state, token, None
    own_dir = data if data_dir is not None else Path(tempfile.mkdtemp(prefix="dispatch-demo-"))
    say(f"starting dispatch (as `dispatch up` does) in {own_dir}")
    embedded = Embedded(own_dir, api_port=0, say=lambda line: say("  " + line.strip()),
                        kill_wait_s=5.0)  # fmt: skip
    state = embedded.start()
    return state, embedded.token, embedded


def run_demo(
    *,
    data_dir: Path | None,
    epochs: int,
    epoch_s: float,
    as_json: bool,
    say: Callable[[str], None],
) -> int:
    """Run the demo (module docstring); return the exit status.

    Raises:
        CliError: the training script is missing, or dispatch can't be started.
    """
    root = source_root()
    script = root / "examples" / "local" / "train.py" if root is not None else None
    if script is None or not script.is_file():
        raise CliError(
            "examples/local/train.py not found next to this CLI: run the demo from dispatch's "
            "source checkout installed with scripts/install.sh"
        )
    lock = threading.Lock()

    def out(line: str) -> None:
        with lock:
            say(line)

    begin = time.monotonic()
    previous = signal.signal(signal.SIGTERM, _interrupt)  # stop as cleanly as on Ctrl-C
    embedded: Embedded | None = None
    director: _Director | None = None
    job_id = ""
    stopping = threading.Event()
    try:
        state, token, embedded = _find_up(data_dir, out)
        client = ApiClient(state.api, token)
        job_id = f"demo-digits-{secrets.token_hex(3)}"
        ckpt_root = Path(state.data_dir) / "demo" / job_id / "checkpoints"
        body: dict[str, Any] = {
            "job_id": job_id,
            "reason": "dispatch demo",
            "spec": {
                "cluster": state.cluster,
                "command": [
                    sys.executable,
                    str(script),
                    "--epochs",
                    str(epochs),
                    "--epoch-s",
                    str(epoch_s),
                ],
                "checkpoint": str(ckpt_root),
                "env": {"PYTHONUNBUFFERED": "1"},
                "options": {"chdir": str(root), "time": "30:00"},
            },
            "policy": {
                "rules": [
                    {"on": ["preempted", "node-lost"], "action": "resubmit", "budget": 3},
                    {"on": ["non-zero-exit", "out-of-memory"], "action": "hold"},
                ]
            },
        }
        answer = client.submit(body)
        out("")
        out(f"submitted job {job_id}: {' '.join(body['spec']['command'][1:])}")
        for line in plan_lines(answer.plan):
            out(line)
        out("")
        out("live status (each change on a line; training output prefixed with |):")
        director = _Director(
            local_data_dir=Path(state.local_data_dir),
            ckpt_root=ckpt_root,
            preempt_after=max(1, epochs // 3),
            say=out,
        )
        director.start()

        def watched(line: str) -> None:
            if not stopping.is_set():  # the stream ends when the demo stops its own up
                out("  " + line)

        watcher = Watcher(client, job_id, emit=watched, on_status=director.saw)
        final = _watch_with_deadline(watcher, director, embedded)
        director.stop()
        records = client.record(job_id).events
        summary = _summary(job_id, final, records, director, begin, state)
        _print_summary(summary, out)
        if as_json:
            out(msgspec.json.encode(summary).decode())
        return _verdict(summary, director, out)
    except KeyboardInterrupt:
        if embedded is None and job_id:
            out(f"interrupted: job {job_id} goes on ({program()} cancel {job_id} --reason ...)")
        raise
    finally:
        stopping.set()
        signal.signal(signal.SIGTERM, previous)
        if director is not None:
            director.stop()
        if embedded is not None:
            out("stopping the demo's dispatch")
            embedded.stop(quiet=True)
            from dispatch_backends.local import kill_all

            kill_all(embedded.local_data_dir)
            out(
                f"its data stays in {embedded.data_dir} (look again: export "
                f"DISPATCH_DATA_DIR={embedded.data_dir}; {program()} up, then in another "
                f"shell with the same export: {program()} status {job_id})"
            )


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _watch_with_deadline(
    watcher: Watcher, director: _Director, embedded: Embedded | None
) -> Status:
    """Run the watcher in a thread until the job settles, restarting a part of the demo's
    own ``up`` that exits meanwhile, as ``dispatch up`` does."""
    result: list[Status] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            result.append(watcher.run())
        except BaseException as err:  # handed to the main thread
            failure.append(err)

    thread = threading.Thread(target=run, name="dispatch-demo-watch", daemon=True)
    thread.start()
    deadline = time.monotonic() + _SETTLE_TIMEOUT_S
    while thread.is_alive():
        thread.join(0.2)
        if embedded is not None:
            embedded.watch()
        if time.monotonic() > deadline:
            raise CliError(f"the demo's job did not settle within {_SETTLE_TIMEOUT_S:g} s")
    if failure:
        raise failure[0]
    return result[0]


def _summary(
    job_id: str,
    final: Status,
    records: tuple[RecordedEvent, ...],
    director: _Director,
    begin: float,
    state: UpState,
) -> DemoSummary:
    executions = _executions(records, director)
    final_loss = final_accuracy = None
    if executions:
        object_id = executions[-1].object.split("/", 1)[1]
        last = _read(director.stdout(ObjectRef(cluster=state.cluster, id=object_id)))
        found = list(_FINAL.finditer(last))
        if found:
            final_loss = float(found[-1].group(1))
            final_accuracy = float(found[-1].group(2)) if found[-1].group(2) else None
    preempted = director.preempted
    return DemoSummary(
        job_id=job_id,
        state=final.state,
        seconds=round(time.monotonic() - begin, 1),
        preempted_object=None if preempted is None else f"{preempted.cluster}/{preempted.id}",
        history=[transition_line(t) for t in final.history],
        executions=executions,
        final_loss=final_loss,
        final_accuracy=final_accuracy,
        record=[event_line(e.seq, e.event) for e in records],
        data_dir=state.data_dir,
    )


def _print_summary(summary: DemoSummary, out: Callable[[str], None]) -> None:
    out("")
    out(f"summary of job {summary.job_id}: {summary.state.value} after {summary.seconds:g} s")
    out("  committed transitions (the job's history):")
    for line in summary.history:
        out(f"    {line}")
    out("  executions:")
    for ex in summary.executions:
        resumed = (
            f"resumed from checkpoint step {ex.resumed_from_step}"
            if ex.resumed_from_step is not None
            else "started from scratch"
        )
        out(
            f"    {ex.object}  submission {ex.submission}  DISPATCH_EPOCH {ex.epoch}  "
            f"{resumed}; ended: {ex.ended or '-'}"
        )
    if summary.final_loss is not None:
        acc = f", test accuracy {summary.final_accuracy:.3f}" if summary.final_accuracy else ""
        out(f"  final loss {summary.final_loss:.4f}{acc}")
    out(f"  the record ({len(summary.record)} events):")
    for line in summary.record:
        out(f"    {line}")


def _verdict(summary: DemoSummary, director: _Director, out: Callable[[str], None]) -> int:
    resumed = [e.resumed_from_step for e in summary.executions[1:] if e.resumed_from_step]
    if summary.state is State.SUCCEEDED and director.preempted is not None and resumed:
        out(
            f"demo done: preempted, resubmitted by its rule, resumed from step {resumed[0]}, "
            "succeeded."
        )
        return EXIT_OK
    if director.preempted is None:
        out(
            "demo: the job ended before it could be preempted"
            + (f" ({director.error})" if director.error else "")
            + "; try a larger --epoch-s"
        )
    else:
        out(f"demo: the job ended {summary.state.value} without resuming as expected")
    return EXIT_FAILURE
