"""``dispatch logs`` against a real ``dispatch up`` (local backend, the locked NATS whose
permissions let only the API ask the cluster's observer): a job's output, its standard error,
``--follow`` streaming lines printed later and ending with the execution, ``status`` saying
where the output is, and the errors a user meets."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.e2e.cli.conftest import JobFile
from tests.e2e.cli.support import PROGRAM, REPO, Up, eventually, flag_of

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

SCRIPT = (
    "echo one; echo two; echo oops >&2; "
    'while [ ! -e "$FLAG" ]; do sleep 0.1; done; '
    "echo three; sleep 0.5; echo four"
)


def _submitted(up: Up, path: Path) -> str:
    result = up.dispatch("submit", str(path), "--json")
    assert result.code == 0, str(result)
    job_id: str = result.json()["job_id"]
    return job_id


class _Follower:
    """``dispatch logs JOB --follow`` in the background, its lines collected as they come."""

    def __init__(self, up: Up, job: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dispatch_cli", "logs", job, "--follow"],
            env=up.env(),
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self.lines.append(raw.decode())

    def has(self, *lines: str) -> None:
        assert self.proc.poll() is None, f"logs --follow ended early: {self.lines}"
        assert self.lines == [f"{line}\n" for line in lines], self.lines

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._reader.join(10)
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()


def test_logs_shows_the_output_and_follow_streams_until_the_execution_ends(
    up: Up, job_file: JobFile
) -> None:
    path = job_file(SCRIPT, name="talks")
    job = _submitted(up, path)

    def printed() -> None:
        shown = up.dispatch("logs", job)
        assert shown.code == 0, str(shown)
        assert shown.out == "one\ntwo\n", str(shown)

    eventually(printed, timeout_s=120)
    err = up.dispatch("logs", job, "--stderr")
    assert err.code == 0, str(err)
    assert err.out == "oops\n"
    first = up.dispatch("logs", job, "--execution", "1")
    assert first.out == "one\ntwo\n", str(first)

    detail = up.dispatch("status", job)
    assert detail.code == 0, str(detail)
    where = next(line for line in detail.out.splitlines() if line.startswith("output: "))
    stdout_file = Path(where.split()[1])
    assert stdout_file.name == "stdout"
    assert stdout_file.is_relative_to(up.local_data_dir)
    assert f"{PROGRAM} logs {job}" in where

    follower = _Follower(up, job)
    try:
        eventually(lambda: follower.has("one", "two"), timeout_s=60)
        flag_of(path).touch()  # now the job prints the rest, and ends
        eventually(lambda: _ended(follower), timeout_s=120)
        assert follower.lines == ["one\n", "two\n", "three\n", "four\n"]
    finally:
        follower.close()
    again = up.dispatch("logs", job)
    assert again.out == "one\ntwo\nthree\nfour\n"


def _ended(follower: _Follower) -> None:
    code = follower.proc.poll()
    assert code is not None, f"still following: {follower.lines}"
    assert follower.proc.stderr is not None
    assert code == 0, follower.proc.stderr.read().decode()


def test_logs_of_what_does_not_exist_is_not_found(up: Up, job_file: JobFile) -> None:
    missing = up.dispatch("logs", "nosuch-k3x9ab2c")
    assert missing.code == 5, str(missing)
    job = _submitted(up, job_file("echo hi", name="short"))
    up.wait_status(job, lambda s: bool(s["settled"]), timeout_s=120)
    unknown = up.dispatch("logs", job, "--execution", "7")
    assert unknown.code == 5, str(unknown)
    assert "no execution 7" in unknown.err
    assert up.dispatch("logs", job).out == "hi\n"
    # Its output file deleted: lost output, said so (not an empty output, exit 0).
    shown = up.dispatch("status", job)
    (where,) = [line for line in shown.out.splitlines() if line.startswith("output: ")]
    stdout = Path(where.removeprefix("output: ").split()[0])
    stdout.unlink()
    for args in ((), ("--follow",)):
        gone = up.dispatch("logs", job, *args)
        assert gone.code == 5, str(gone)
        assert f"{stdout} is gone" in gone.err, str(gone)
        assert "Traceback" not in gone.err, str(gone)
