"""Failover to another cluster (issue 14, part 2) end to end on the local backend: one
``dispatch up --clusters FILE`` serves two local clusters (the built-in ``local`` and
``lab2``, each with its own data directory and observer). A job submitted from a TOML job
file to ``lab2`` loses its node; past ``lab2``'s node-loss window the fence stops it and the
failover rule moves the next submission to ``local``, where it runs (its gate opened only once
``lab2``'s scheduler shows the old object ended), with a higher epoch, and succeeds. The
record and the Status show which cluster each execution ran on. The API refuses (exit 7, the
CLI's code for a 400) a failover job whose checkpoint root a listed cluster can't see,
naming both."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dispatch_backends.local import Faults, kill_all
from tests.e2e.cli.support import Up, eventually

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

SECOND = "lab2"
PRINT_AND_WAIT = (
    "env | grep '^DISPATCH_' || true; while [ ! -e \"$FLAG\" ]; do sleep 0.1; done; echo finished"
)


def _job_toml(flag: Path, root: str) -> str:
    return (
        'name = "failover"\n'
        "[spec]\n"
        f'cluster = "{SECOND}"\n'
        f"command = {json.dumps(['/bin/sh', '-c', PRINT_AND_WAIT])}\n"
        f'checkpoint = "{root}"\n'
        "[spec.env]\n"
        f'FLAG = "{flag}"\n'
        "[[policy.rules]]\n"
        'on = ["node-lost", "no-capacity", "launch-failed"]\n'
        'action = "resubmit"\n'
        "budget = 3\n"
        f'clusters = ["{SECOND}", "local"]\n'
    )


def _epoch_printed(objects_dir: Path, object_id: str) -> int:
    def read() -> int:
        text = (objects_dir / object_id / "stdout").read_text()
        values = [
            line.partition("=")[2]
            for line in text.splitlines()
            if line.startswith("DISPATCH_EPOCH=")
        ]
        assert values, text
        return int(values[0])

    return eventually(read, timeout_s=30)


def test_a_job_that_loses_its_node_fails_over_to_the_next_cluster_and_finishes(
    tmp_path: Path,
) -> None:
    second_dir = tmp_path / "lab2-objects"
    shared = tmp_path / "shared"
    clusters = tmp_path / "clusters.toml"
    clusters.write_text(
        f'[[clusters]]\nname = "{SECOND}"\nbackend = "local"\ndata_dir = "{second_dir}"\n'
        f'kill_wait_s = 1\nnode_loss_window_s = 2\nshared_paths = ["{shared}"]\n'
    )
    up = Up(tmp_path / "data", args=("--clusters", str(clusters)))
    up.start()
    try:
        flag = tmp_path / "flag"
        # Refused at the door: lab2 sees only the shared directory (naming root and cluster).
        private = tmp_path / "private" / "{job}"
        refused_file = tmp_path / "refused.toml"
        refused_file.write_text(_job_toml(flag, str(private)))
        refused = up.dispatch("submit", str(refused_file))
        assert refused.code == 7, str(refused)
        assert str(private) in refused.err, str(refused)
        assert f"'{SECOND}'" in refused.err, str(refused)

        job_file = tmp_path / "job.toml"
        job_file.write_text(_job_toml(flag, f"{shared}/ckpt/{{job}}"))
        job = "failover-1"
        submitted = up.dispatch("submit", str(job_file), "--job-id", job)
        assert submitted.code == 0, str(submitted)
        assert f"(fail over: {SECOND} -> local)" in submitted.out, str(submitted)

        status = up.wait_status(job, lambda s: s["state"] == "running")
        assert status["cluster"] == SECOND
        (first,) = status["objects"]
        assert first["cluster"] == SECOND
        first_epoch = _epoch_printed(second_dir / "objects", first["id"])
        assert first_epoch == status["epoch"]

        Faults(second_dir).node_lost(first["id"])

        status = up.wait_status(
            job,
            lambda s: (
                s["state"] == "running"
                and s["cluster"] == "local"
                and any(o["cluster"] == "local" for o in s["objects"])
            ),
            timeout_s=120,
        )
        assert status["submission"] == 2
        (second,) = [o for o in status["objects"] if o["cluster"] == "local"]
        second_epoch = _epoch_printed(up.local_data_dir / "objects", second["id"])
        assert second_epoch > first_epoch
        assert second_epoch == status["epoch"]
        # The jobs table says where it was submitted and where it runs now (it said lab2).
        listed = up.dispatch("status")
        (row,) = [line.split() for line in listed.out.splitlines() if line.startswith(job)]
        assert row[3] == f"{SECOND}->local", listed.out

        flag.touch()
        watched = up.dispatch("watch", job, timeout_s=120)
        assert watched.code == 0, str(watched)
        assert f"job {job} settled: succeeded" in watched.out

        # The record shows both clusters: each launch's object, and the failover submission.
        record = up.dispatch("record", job)
        assert record.code == 0, str(record)
        assert f"launch 1/1 -> {SECOND}/{first['id']}" in record.out, record.out
        assert "submission 2 opened (recovery) on local" in record.out, record.out
        assert f"launch 2/1 -> local/{second['id']}" in record.out, record.out
        assert f"{SECOND}/{first['id']} ended: node-lost" in record.out, record.out
        shown = up.dispatch("status", job)
        assert "submission  2 on local" in shown.out, str(shown)
    finally:
        try:
            up.close()
        finally:
            kill_all(second_dir)


def test_a_job_every_launch_of_which_is_refused_fails_over_and_finishes(tmp_path: Path) -> None:
    """``lab2`` refuses every launch attempt (the local backend's ``refuse_next`` fault): the
    failover rule covers ``launch-failed``, so submission 2 runs on ``local`` instead of the
    job failing ``refused:1``."""
    second_dir = tmp_path / "lab2-objects"
    clusters = tmp_path / "clusters.toml"
    clusters.write_text(
        f'[[clusters]]\nname = "{SECOND}"\nbackend = "local"\ndata_dir = "{second_dir}"\n'
        "kill_wait_s = 1\n"
    )
    up = Up(tmp_path / "data", args=("--clusters", str(clusters)))
    up.start()
    try:
        flag = tmp_path / "flag"
        Faults(second_dir).refuse_next(3, "no partition takes this job")
        job_file = tmp_path / "job.toml"
        job_file.write_text(_job_toml(flag, f"{tmp_path}/ckpt/{{job}}"))
        job = "refused-1"
        submitted = up.dispatch("submit", str(job_file), "--job-id", job)
        assert submitted.code == 0, str(submitted)
        status = up.wait_status(
            job, lambda s: s["state"] == "running" and s["cluster"] == "local", timeout_s=120
        )
        assert status["submission"] == 2
        assert status["epoch"] == 2_000_000
        flag.touch()
        watched = up.dispatch("watch", job, timeout_s=120)
        assert watched.code == 0, str(watched)
        assert f"job {job} settled: succeeded" in watched.out
        record = up.dispatch("record", job)
        assert record.out.count("refused") >= 3, record.out
        assert "submission 2 opened (recovery) on local" in record.out, record.out
        assert "refused:1" not in record.out, record.out
    finally:
        try:
            up.close()
        finally:
            kill_all(second_dir)
