"""``dispatch up --clusters FILE`` against real parts: a second cluster on the local backend,
with its own data directory, served beside the built-in one by an observer of its own; and
clusters files that are refused before anything starts."""

from __future__ import annotations

import json
import os
import signal
import socket
from pathlib import Path
from typing import Any

import pytest

from dispatch_backends.local import kill_all
from dispatch_cli.embedded import free_port
from tests.e2e.cli.support import WAIT_FOR_FLAG, Up, cli_env, eventually, run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

SECOND = "lab2"


def _observer_pids(clusters_file: Path, cluster: str) -> list[int]:
    """The observer processes of ``cluster`` reading ``clusters_file`` (from ``/proc``)."""
    want = {f"OBSERVER_CLUSTER={cluster}", f"OBSERVER_CLUSTERS_FILE={clusters_file}"}
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            env = (proc / "environ").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if b"services.observer" in argv and want <= set(env):
            found.append(int(proc.name))
    return found


def _processes_naming(path: Path) -> list[str]:
    """Command lines of the processes that name ``path`` (a data directory) in theirs."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if str(path) in argv:
            found.append(argv.replace("\0", " "))
    return found


def test_a_second_local_cluster_runs_jobs_under_its_own_observer(tmp_path: Path) -> None:
    """A job submitted through the CLI to the file's cluster runs in that cluster's data
    directory, is observed by ``observer-lab2`` (a restarted one, after it is killed), and
    succeeds; the built-in cluster is still served."""
    second_dir = tmp_path / "lab2-objects"
    clusters = tmp_path / "more" / "clusters.toml"
    clusters.parent.mkdir()
    # A relative data_dir is taken from the file's directory.
    clusters.write_text(
        f'[[clusters]]\nname = "{SECOND}"\nbackend = "local"\ndata_dir = "../lab2-objects"\n'
        "kill_wait_s = 2\n"
    )
    up = Up(tmp_path / "data", args=("--clusters", str(clusters)))
    up.start()
    try:
        out = up.output()
        assert f"observer of cluster {SECOND!r} (local backend, polled every 0.5 s)" in out, out
        assert f"observer-{SECOND} ready" in out, out
        assert f"{SECOND} (local backend; observer log" in out, out
        assert json.loads((up.data_dir / "up.json").read_text())["clusters"] == ["local", SECOND]
        merged = json.loads((up.data_dir / "clusters.json").read_text())["clusters"]
        assert [(c["name"], c["data_dir"]) for c in merged] == [
            ("local", str(up.local_data_dir)),
            (SECOND, str(second_dir)),
        ]

        flag = tmp_path / "flag"
        job_path = tmp_path / "job.json"
        body: dict[str, Any] = {
            "name": "second",
            "spec": {
                "cluster": SECOND,
                "command": ["/bin/sh", "-c", WAIT_FOR_FLAG],
                "env": {"FLAG": str(flag)},
            },
        }
        job_path.write_text(json.dumps(body))
        submitted = up.dispatch("submit", str(job_path), "--json")
        assert submitted.code == 0, str(submitted)
        job = submitted.json()["job_id"]
        status = up.wait_status(job, lambda s: s["state"] == "running")
        assert [o["cluster"] for o in status["objects"]] == [SECOND]
        object_id = status["objects"][0]["id"]
        assert (second_dir / "objects" / object_id).is_dir()
        assert not (up.local_data_dir / "objects" / object_id).exists()

        # The cluster's observer is a child like the others: killed, it is restarted, and
        # the job's end is observed by the new one.
        pids = _observer_pids(up.data_dir / "clusters.json", SECOND)
        assert len(pids) == 1, pids
        os.kill(pids[0], signal.SIGKILL)
        eventually(
            lambda: _assert_in(f"observer-{SECOND} exited with status -9", up.output()),
            timeout_s=20,
        )
        eventually(
            lambda: _assert_in(f"observer-{SECOND} ready", up.output().rsplit("exited", 1)[1]),
            timeout_s=30,
        )
        restarted = _observer_pids(up.data_dir / "clusters.json", SECOND)
        assert len(restarted) == 1, restarted
        assert restarted != pids

        flag.touch()
        watched = up.dispatch("watch", job, timeout_s=120)
        assert watched.code == 0, str(watched)
        assert f"job {job} settled: succeeded" in watched.out

        log = (up.data_dir / "logs" / f"observer-{SECOND}.log").read_text()
        started = [json.loads(line) for line in log.splitlines() if "observer.started" in line]
        assert [e["cluster"] for e in started] == [SECOND, SECOND]
        local_log = (up.data_dir / "logs" / "observer.log").read_text()
        assert f'"cluster":"{SECOND}"' not in local_log
        assert '"cluster":"local"' in local_log
    finally:
        try:
            up.close()
        finally:
            kill_all(second_dir)
    out = up.output()
    assert f"stopped observer-{SECOND}" in out, out
    assert out.index("stopped supervisor") < out.index(f"stopped observer-{SECOND}")


def _assert_in(needle: str, text: str) -> None:
    assert needle in text, text


@pytest.mark.parametrize(
    ("contents", "complaint"),
    [
        (
            '[[clusters]]\nname = "hpc"\nbackend = "slurmm"\n',
            "Invalid value 'slurmm' - at `$.clusters[0].backend` "
            "(backends: local, slurm, kubeflow)",
        ),
        (
            '[[clusters]]\nname = "hpc"\nbackend = "slurm"\nnode_loss_window = 60\n',
            "Object contains unknown field `node_loss_window` - at `$.clusters[0]`",
        ),
        (
            '[[clusters]]\nname = "hpc"\nbackend = "slurm"\nnode_loss_window_s = -1\n',
            "node_loss_window_s must be > 0, got -1.0 - at `$.clusters[0]`",
        ),
        (
            '[[clusters]]\nname = "b"\nbackend = "local"\ndata_dir = "b"\nkill_wait_s = -1\n',
            "cluster 'b': kill_wait_s must be >= 0, got -1.0",
        ),
        (
            '[[clusters]]\nname = "local"\nbackend = "local"\ndata_dir = "elsewhere"\n',
            "cluster 'local' is dispatch up's own local cluster",
        ),
        (
            '[[clusters]]\nname = "b"\nbackend = "local"\ndata_dir = "data/local"\n',
            "is that of the built-in cluster 'local'; each local cluster needs a directory",
        ),
        ("# nothing yet\n", "the file names no cluster"),
        ('[[clusters]]\nname = "hpc"\nbackend = "slurm"\n[oops\n', "not valid TOML"),
    ],
    ids=[
        "unknown-backend",
        "unknown-field",
        "bad-value",
        "refused-by-backend",
        "named-local",
        "shared-data-dir",
        "empty",
        "not-toml",
    ],
)
def test_a_bad_clusters_file_is_refused_before_anything_starts(
    tmp_path: Path, contents: str, complaint: str
) -> None:
    """Exit 2, a message naming the file and what is wrong; no process, no data directory,
    nothing listening on the API's port."""
    clusters = tmp_path / "clusters.toml"
    clusters.write_text(contents)
    data = tmp_path / "data"
    port = free_port()
    result = run_cli(
        "up",
        "--data-dir",
        str(data),
        "--port",
        str(port),
        "--clusters",
        str(clusters),
        env=cli_env({"DISPATCH_DATA_DIR": str(data)}),
        timeout_s=30,
    )
    assert result.code == 2, str(result)
    assert result.err.startswith("error: --clusters"), str(result)
    assert str(clusters) in result.err, str(result)
    assert complaint in result.err, str(result)
    assert "starting" not in result.out + result.err, str(result)
    assert not (data / "logs").exists()
    assert not (data / "up.json").exists()
    assert _processes_naming(data) == []
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0


def test_a_missing_clusters_file_is_refused_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.toml"
    result = run_cli(
        "up", "--data-dir", str(tmp_path / "data"), "--clusters", str(missing), env=cli_env()
    )
    assert result.code == 2, str(result)
    assert f"cannot read the clusters file {str(missing)!r}" in result.err, str(result)
    assert not (tmp_path / "data").exists()
