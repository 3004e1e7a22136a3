"""The CLI's pure parts, without a server: job files and batch scripts, rule flags,
durations, and how ``watch`` shows a transition the status stream skipped."""

from __future__ import annotations

import http.server
import json
import re
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar

import msgspec
import pytest

from dispatch_cli.errors import UsageError
from dispatch_cli.jobfile import PolicyFlags, build_submission, parse_causes, parse_duration
from dispatch_cli.main import main
from dispatch_cli.watching import MISSED_NOTE, Watcher
from dispatch_core import (
    JOB_PLACEHOLDER,
    Action,
    Actor,
    ActorKind,
    Cause,
    CauseKind,
    Declarations,
    JobCreated,
    Level,
    Provenance,
    State,
    Status,
    Submit,
    Transition,
    decide,
)
from services.api.schemas import SubmitRequest, check_spec, decode_body
from tests.e2e.cli.support import REPO
from tests.util import ReplayedStatusStream

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def build(path: Path, **options: Any) -> dict[str, Any]:
    defaults: dict[str, Any] = {
        "cluster": None,
        "name": None,
        "job_id": None,
        "reason": None,
        "chdir": "/work",
        "policy_file": None,
        "flags": PolicyFlags(),
    }
    return build_submission(path, **{**defaults, **options})


def test_a_toml_job_file_is_the_submit_body_run_where_it_was_submitted(tmp_path: Path) -> None:
    path = tmp_path / "job.toml"
    path.write_text(
        'name = "digits"\n[spec]\ncluster = "local"\ncommand = ["python", "t.py"]\n'
        '[[policy.rules]]\non = ["preempted"]\naction = "resubmit"\nbudget = 2\n'
    )
    body = build(path, reason="because")
    assert body == {
        "name": "digits",
        "reason": "because",
        "spec": {"cluster": "local", "command": ["python", "t.py"], "options": {"chdir": "/work"}},
        "policy": {"rules": [{"on": ["preempted"], "action": "resubmit", "budget": 2}]},
    }
    assert build(path, cluster="other")["spec"]["cluster"] == "other"


def test_a_job_files_own_chdir_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "job.json"
    path.write_text(json.dumps({"spec": {"cluster": "c", "options": {"chdir": "/data", "x": "1"}}}))
    assert build(path)["spec"]["options"] == {"chdir": "/data", "x": "1"}


def test_a_batch_script_needs_a_cluster_and_takes_its_name_and_the_flags(tmp_path: Path) -> None:
    path = tmp_path / "train.sh"
    path.write_text("#!/bin/bash\n#SBATCH -J My.Big_Run\n#SBATCH --nodes=2\nsrun python t.py\n")
    with pytest.raises(UsageError, match="--cluster"):
        build(path)
    flags = PolicyFlags(resubmit_on=parse_causes("preempted,node-lost", option="--x"), budget=5)
    body = build(path, cluster="slurm", flags=flags)
    assert body["spec"]["script"] == path.read_text()
    assert body["spec"]["cluster"] == "slurm"
    assert body["name"] == "my-big-run"
    assert body["policy"] == {
        "rules": [{"on": ["preempted", "node-lost"], "action": "resubmit", "budget": 5}]
    }


def test_a_policy_is_given_once(tmp_path: Path) -> None:
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"spec": {"cluster": "c"}, "policy": {"rules": []}}))
    policy = tmp_path / "rules.toml"
    policy.write_text('[[rules]]\non = ["unknown"]\naction = "hold"\n')
    flags = PolicyFlags(hold_on=(CauseKind.UNKNOWN,))
    with pytest.raises(UsageError, match="has its own"):
        build(job, policy_file=policy)
    script = tmp_path / "s.sbatch"
    script.write_text("#SBATCH --time=1\n")
    with pytest.raises(UsageError, match="not both"):
        build(script, cluster="c", policy_file=policy, flags=flags)
    body = build(script, cluster="c", policy_file=policy)
    assert body["policy"] == {"rules": [{"on": ["unknown"], "action": "hold"}]}


def test_flags_and_files_that_make_no_sense_are_usage_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="--budget"):
        PolicyFlags(budget=3).rules()
    with pytest.raises(UsageError, match="not a cause a rule may cover"):
        parse_causes("preempted,cancelled", option="--resubmit-on")
    with pytest.raises(UsageError, match="cannot read the job file"):
        build(tmp_path / "missing.toml")
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    with pytest.raises(UsageError, match="a job file is a table"):
        build(bad)


EXAMPLE_JOB_FILES = sorted(
    path.relative_to(REPO).as_posix()
    for path in (REPO / "examples").rglob("*.toml")
    if path.name not in ("clusters.toml", "policy.toml")
)
"""Every job file under examples/ (``clusters.toml`` is a clusters file, ``policy.toml`` a
policy file)."""


def test_the_job_files_the_readmes_name_are_among_the_examples() -> None:
    assert {
        "examples/local-train.toml",
        "examples/slurm-train.toml",
        "examples/slurm/digits-requeue.toml",
        "examples/slurm/digits.toml",
    } <= set(EXAMPLE_JOB_FILES)


@pytest.mark.parametrize("name", EXAMPLE_JOB_FILES)
def test_an_example_job_file_is_accepted_and_gives_each_job_its_own_root(name: str) -> None:
    """The body ``dispatch submit`` sends decodes as the API's ``SubmitRequest`` and passes
    its checks; ``decide`` accepts it, and the recorded checkpoint root is the job's own
    (``{job}`` replaced by the job id), so two submissions of the file never share one."""
    body = build(REPO / name)
    request = decode_body(SubmitRequest, msgspec.json.encode(body))
    check_spec(request.spec)
    assert request.spec.checkpoint is not None
    assert request.spec.checkpoint.endswith("/" + JOB_PLACEHOLDER), request.spec.checkpoint
    native = frozenset({Action.REQUEUE}) if request.spec.cluster == "slurm" else frozenset()
    roots = []
    for job_id in (f"{request.name}-a1b2c3d4", f"{request.name}-e5f6a7b8"):
        (created,) = decide(
            None,
            Submit(
                by=Actor(name="alice", kind=ActorKind.HUMAN),
                job_id=job_id,
                spec=request.spec,
                policy=request.policy,
                declarations=Declarations(node_loss_window_s=60.0, native_actions=native),
            ),
            T0,
        )
        assert isinstance(created, JobCreated)
        assert created.plan.rules, "the example has recovery rules"
        assert created.spec.checkpoint == request.spec.checkpoint.replace(JOB_PLACEHOLDER, job_id)
        roots.append(created.spec.checkpoint)
    assert roots[0] != roots[1]


@pytest.mark.parametrize(
    ("text", "seconds"), [("90", 90.0), ("90s", 90.0), ("30m", 1800.0), ("2h", 7200.0)]
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text, option="--for") == seconds


def test_a_duration_that_is_not_one_is_refused() -> None:
    with pytest.raises(UsageError, match="not a duration"):
        parse_duration("soon", option="--for")


# ------------------------------------------------------------------------------ watch


def _status(
    state: State, kind: CauseKind, history: list[tuple[State, CauseKind]], seq: int
) -> Status:
    return Status(
        job_id="j",
        level=Level.FULL,
        state=state,
        cause=Cause(kind=kind, provenance=Provenance.SCHEDULER),
        at=T0 + timedelta(seconds=seq),
        seq=seq,
        history=tuple(
            Transition(
                at=T0 + timedelta(seconds=i),
                state=s,
                cause=Cause(kind=k, provenance=Provenance.SCHEDULER),
            )
            for i, (s, k) in enumerate(history)
        ),
        settled=state.terminal,
    )


def test_watch_shows_a_transition_the_stream_skipped_from_the_record() -> None:
    """The stream skipped the Status of the first recovery (replaced within milliseconds):
    the next Status's history holds it, and watch prints it, marked, before that Status."""
    recovering = (State.RECOVERING, CauseKind.PREEMPTED)
    statuses = [
        _status(State.RUNNING, CauseKind.NONE, [], 1),
        # skipped: _status(State.RECOVERING, PREEMPTED, [recovering], 2)
        _status(State.RUNNING, CauseKind.NONE, [recovering], 3),
        _status(State.RECOVERING, CauseKind.PREEMPTED, [recovering, recovering], 4),
        _status(
            State.SUCCEEDED,
            CauseKind.NONE,
            [recovering, recovering, (State.SUCCEEDED, CauseKind.NONE)],
            5,
        ),
    ]
    lines: list[str] = []
    final = Watcher(ReplayedStatusStream(statuses), "j", emit=lines.append).run()
    assert final.state is State.SUCCEEDED
    missed = [line for line in lines if line.endswith(MISSED_NOTE)]
    assert len(missed) == 1
    assert "recovering  preempted" in missed[0]
    kinds = [re.findall(r"\b(running|recovering|succeeded)\b", line)[0] for line in lines]
    assert kinds == ["running", "recovering", "running", "recovering", "succeeded"]


# ------------------------------------------------------------------ errors and retries


class _Canned(http.server.BaseHTTPRequestHandler):
    """Answers as the API would for a few routes; remembers each request."""

    seen: ClassVar[list[tuple[str, str, str | None]]] = []

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, code: int, body: object, headers: dict[str, str] | None = None) -> None:
        data = body if isinstance(body, bytes) else msgspec.json.encode(body)
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _error(self, code: int, kind: str, message: str, field: str | None = None) -> None:
        detail: dict[str, str] = {"code": kind, "message": message}
        if field:
            detail["field"] = field
        self._send(code, {"error": detail})

    def do_GET(self) -> None:
        self.seen.append(("GET", self.path, None))
        match self.path:
            case "/v1/jobs/forbidden":
                self._error(403, "forbidden", "only a human may abandon")
            case "/v1/jobs/gateway":
                self._send(502, b"<html>bad gateway</html>")
            case _:
                self._error(404, "not-found", f"no job {self.path.rsplit('/', 1)[1]!r}")

    def do_POST(self) -> None:
        key = self.headers.get("Idempotency-Key")
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.seen.append(("POST", self.path, key))
        match self.path:
            case "/v1/jobs":
                self._error(400, "unknown-cluster", "no cluster 'mars'", "spec.cluster")
            case "/v1/jobs/j/cancel":
                self._error(409, "refused", "the job's outcome (succeeded) is committed")
            case "/v1/jobs/j/hold" if len(self.seen) == 1:
                self._error(503, "busy", "try again")
            case "/v1/jobs/j/hold":
                status = _status(State.HELD, CauseKind.HELD, [], 7)
                body = {"job_id": "j", "command": "hold", "seq": 7, "events": [], "status": status}
                self._send(200, body)
            case _:
                self._error(404, "not-found", "no such route")


@pytest.fixture
def canned(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[str]:
    """A canned API on a free port, named by DISPATCH_API."""
    _Canned.seen = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Canned)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setenv("DISPATCH_API", url)
    monkeypatch.setenv("DISPATCH_TOKEN", "t")
    monkeypatch.setenv("DISPATCH_DATA_DIR", str(tmp_path))
    try:
        yield url
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["status", "forbidden"], 4, "error: forbidden (403): only a human may abandon"),
        (["status", "nope"], 5, "error: not found (404): no job 'nope'"),
        (
            ["cancel", "j", "--reason", "r"],
            6,
            "error: refused (409): the job's outcome (succeeded) is committed",
        ),
        (["status", "gateway"], 1, "the API failed (502 502): <html>bad gateway</html>"),
    ],
)
def test_each_api_error_has_its_exit_code_and_says_why(
    canned: str, capsys: pytest.CaptureFixture[str], argv: list[str], code: int, message: str
) -> None:
    assert main(argv) == code
    assert message in capsys.readouterr().err


def test_a_400_names_the_field(
    canned: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "job.toml"
    path.write_text('[spec]\ncluster = "mars"\n')
    assert main(["submit", str(path)]) == 7
    err = capsys.readouterr().err
    assert "invalid request (400 unknown-cluster) (field spec.cluster): no cluster 'mars'" in err


def test_a_busy_api_is_retried_with_the_same_idempotency_key(
    canned: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["hold", "j", "--reason", "maintenance", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["command"] == "hold"
    keys = [key for method, path, key in _Canned.seen if path == "/v1/jobs/j/hold"]
    assert len(keys) == 2
    assert keys[0] is not None
    assert keys[0] == keys[1]
