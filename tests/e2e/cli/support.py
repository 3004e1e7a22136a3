"""A real ``dispatch up`` for the CLI's end-to-end tests, and the CLI run as users run it.

``Up`` starts ``python -m dispatch_cli up --data-dir <tmp> --port <free>`` as a subprocess
(nats-server, observer, supervisor, notifier and API as its children), waits for its
``up.json`` and the API's ``/healthz``, and stops it with SIGINT as Ctrl-C does. Each
``dispatch(...)`` call runs the CLI as a subprocess against it (``DISPATCH_API``,
``DISPATCH_TOKEN`` and ``DISPATCH_DATA_DIR`` set, so nothing of the user's own data
directory is read).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Final, TypeVar

from dispatch_backends.local import Faults, kill_all
from dispatch_cli.embedded import free_port

__all__ = [
    "PROGRAM",
    "REPO",
    "RESUBMIT",
    "WAIT_FOR_FLAG",
    "Result",
    "Up",
    "cli_env",
    "eventually",
    "flag_of",
    "run_cli",
]

REPO: Final = Path(__file__).resolve().parents[3]
T = TypeVar("T")

PROGRAM: Final = f"{sys.executable} -m dispatch_cli"
"""What the CLI run by :func:`run_cli` names itself in the commands it prints to run
(``dispatch_cli.program``: run as ``python -m dispatch_cli``, it says so)."""

WAIT_FOR_FLAG: Final = 'while [ ! -e "$FLAG" ]; do sleep 0.1; done; echo finished'
"""A job that runs until the test creates its ``$FLAG`` file, then exits 0."""
RESUBMIT: Final = [{"on": ["preempted", "node-lost"], "action": "resubmit", "budget": 3}]


def flag_of(job_file: Path) -> Path:
    """The ``FLAG`` file of a job file the ``job_file`` fixture wrote."""
    return Path(json.loads(job_file.read_text())["spec"]["env"]["FLAG"])


def cli_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a CLI subprocess: this one, with the source tree importable and
    nothing pointing at a user's own dispatch."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCH_")}
    paths = [str(REPO), str(REPO / "libs"), str(REPO / "libs" / "ckpt")]
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


@dataclass(frozen=True)
class Result:
    """What a CLI run printed, and its exit status."""

    args: tuple[str, ...]
    code: int
    out: str
    err: str

    def json(self) -> Any:
        """Its standard output, parsed as one JSON document."""
        return json.loads(self.out)

    def __str__(self) -> str:
        command = " ".join(self.args)
        return f"dispatch {command} -> {self.code}\n--- stdout\n{self.out}--- stderr\n{self.err}"


def run_cli(
    *args: str, env: Mapping[str, str], timeout_s: float = 60.0, cwd: Path = REPO
) -> Result:
    """Run ``python -m dispatch_cli ARGS`` and return what it did."""
    proc = subprocess.run(
        [sys.executable, "-m", "dispatch_cli", *args],
        env=dict(env),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    return Result(tuple(args), proc.returncode, proc.stdout, proc.stderr)


def eventually(check: Callable[[], T], *, timeout_s: float = 30.0, interval_s: float = 0.2) -> T:
    """Call ``check`` until it stops raising ``AssertionError``; return its value."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return check()
        except AssertionError:
            if time.monotonic() > deadline:
                raise
        time.sleep(interval_s)


class Up:
    """One ``dispatch up`` on its own data directory (see the module docstring)."""

    def __init__(
        self, data_dir: Path, *, port: int | None = None, args: Sequence[str] = ()
    ) -> None:
        self.data_dir = data_dir
        self.args = tuple(args)
        """More arguments of ``dispatch up`` (e.g. ``--clusters FILE``)."""
        self.port = port or free_port()
        self.api = f"http://127.0.0.1:{self.port}"
        self.output_path = data_dir.parent / f"{data_dir.name}-up.out"
        self.proc: subprocess.Popen[bytes] | None = None
        self._out: IO[bytes] | None = None

    @property
    def token(self) -> str:
        """The token ``up`` keeps in its data directory."""
        return (self.data_dir / "token").read_text().strip()

    @property
    def local_data_dir(self) -> Path:
        """The local backend's data directory."""
        return self.data_dir / "local"

    @property
    def faults(self) -> Faults:
        """Fault injection into the local backend."""
        return Faults(self.local_data_dir)

    def output(self) -> str:
        """What ``dispatch up`` printed so far."""
        try:
            return self.output_path.read_text(errors="replace")
        except OSError:
            return ""

    def start(self, timeout_s: float = 90.0) -> None:
        """Start it and wait until it says it is up (``up.json`` written, API healthy)."""
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        self._out = self.output_path.open("ab")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dispatch_cli",
                "up",
                "--data-dir",
                str(self.data_dir),
                "--port",
                str(self.port),
                *self.args,
            ],
            # A user's environment often has an unrelated API_KEY: up must not hand it to
            # the API service (which refuses API_* variables it doesn't know).
            env=cli_env({"API_KEY": "unrelated", "SUPERVISOR_TYPO": "x"}),
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=self._out,
            stderr=subprocess.STDOUT,
        )
        proc = self.proc

        def ready() -> None:
            assert proc.poll() is None, f"dispatch up exited {proc.returncode}:\n{self.output()}"
            state = json.loads((self.data_dir / "up.json").read_text())
            assert state["pid"] == proc.pid
            with urllib.request.urlopen(f"{self.api}/healthz", timeout=2) as response:
                assert response.status == 200

        try:
            eventually(_as_assertion(ready), timeout_s=timeout_s)
        except AssertionError as err:
            raise AssertionError(f"dispatch up not ready: {err}\n{self.output()}") from None

    def stop(self, timeout_s: float = 60.0) -> int:
        """Ctrl-C it (SIGINT) and wait for it to end; return its exit status."""
        code = 0
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                code = self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(f"dispatch up ignored SIGINT:\n{self.output()}") from None
        elif self.proc is not None:
            code = self.proc.returncode
        if self._out is not None:
            self._out.close()
            self._out = None
        return code

    def close(self) -> None:
        """Stop it (if running) and kill every job left on its local backend."""
        try:
            self.stop()
        finally:
            kill_all(self.local_data_dir)

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a CLI run against this ``up``."""
        return cli_env(
            {
                "DISPATCH_API": self.api,
                "DISPATCH_TOKEN": self.token,
                "DISPATCH_DATA_DIR": str(self.data_dir),
                **extra,
            }
        )

    def dispatch(self, *args: str, timeout_s: float = 60.0, **env: str) -> Result:
        """Run the CLI against this ``up``."""
        return run_cli(*args, env=self.env(**env), timeout_s=timeout_s)

    def status(self, job_id: str) -> dict[str, Any]:
        """The job's Status (``dispatch status JOB --json``)."""
        result = self.dispatch("status", job_id, "--json")
        assert result.code == 0, str(result)
        status: dict[str, Any] = result.json()["status"]
        return status

    def wait_status(
        self, job_id: str, check: Callable[[dict[str, Any]], bool], *, timeout_s: float = 60.0
    ) -> dict[str, Any]:
        """Wait until the job's Status passes ``check``; return it."""
        seen: list[dict[str, Any]] = []

        def probe() -> dict[str, Any]:
            status = self.status(job_id)
            seen.append(status)
            assert check(status), f"job {job_id}: {status['state']} {status['cause']}"
            return status

        try:
            return eventually(probe, timeout_s=timeout_s, interval_s=0.3)
        except AssertionError as err:
            raise AssertionError(f"{err}\nlast: {seen[-1:]}\n{self.output()}") from None

    def object_id(self, job_id: str, *, not_: str | None = None) -> str:
        """The id of the job's live object (other than ``not_``), waiting for one."""
        status = self.wait_status(job_id, lambda s: any(o["id"] != not_ for o in s["objects"]))
        ids = [o["id"] for o in status["objects"] if o["id"] != not_]
        return str(ids[0])


def _as_assertion(check: Callable[[], None]) -> Callable[[], None]:
    """Turn the errors of a not-yet-ready service (no file, connection refused) into
    ``AssertionError`` so :func:`eventually` retries them."""

    def wrapped() -> None:
        try:
            check()
        except (OSError, ValueError, KeyError) as err:
            raise AssertionError(repr(err)) from None

    return wrapped
