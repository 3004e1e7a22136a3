"""``dispatch up --clusters examples/slurm/clusters.toml`` on the real Slurm test cluster: the
newcomer's path of ``examples/slurm/README.md`` (section 2), through the CLI alone.

A short batch script (``#SBATCH -p debug``, an echo, exit 0) is submitted with ``dispatch
submit --cluster slurm``; the embedded default's Slurm observer sees it end, and ``dispatch
status --json`` shows it succeeded. Its output is where the example's clusters file puts it,
and ``dispatch logs`` shows it (``status`` says where it is).
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import Final

import pytest

from tests.e2e.cli.support import REPO, Up
from tests.integration.slurm.test_slurm_support import require_cluster, run

pytestmark = [pytest.mark.slurm, pytest.mark.integration, pytest.mark.e2e]

CLUSTERS: Final = REPO / "examples" / "slurm" / "clusters.toml"
SCRIPT: Final = """#!/bin/sh
#SBATCH --job-name=up-hello
#SBATCH -p debug
#SBATCH --time=2
#SBATCH --mem=100M
echo "hello from slurm job $SLURM_JOB_ID on $SLURMD_NODENAME"
sleep 2
exit 0
"""


@pytest.mark.timeout(180)
def test_up_with_the_examples_clusters_file_runs_a_batch_script_on_slurm(
    tmp_path: Path,
) -> None:
    require_cluster()
    script = tmp_path / "hello.sbatch"
    script.write_text(SCRIPT)
    up = Up(tmp_path / "data", args=("--clusters", str(CLUSTERS)))
    up.start()
    job = ""
    try:
        out = up.output()
        assert "observer of cluster 'slurm' (slurm backend, polled every 3 s)" in out, out
        assert "observer-slurm ready" in out, out

        submitted = up.dispatch(
            "submit", str(script), "--cluster", "slurm", "--chdir", str(tmp_path), "--json"
        )
        assert submitted.code == 0, str(submitted)
        job = submitted.json()["job_id"]
        assert job.startswith("up-hello-")

        status = up.wait_status(job, lambda s: s["state"] == "succeeded", timeout_s=90)
        assert status["cause"]["detail"] == "COMPLETED 0:0", status
        record = up.dispatch("status", job, "--events")
        launched = re.search(r"launch 1/1 -> slurm/(\d+)$", record.out, re.MULTILINE)
        assert launched is not None, str(record)
        slurm_id = launched.group(1)
        output = Path("/tmp") / f"dj-{job}-{slurm_id}.out"
        assert f"hello from slurm job {slurm_id} on node" in output.read_text()
        # `dispatch logs` reads it through the Slurm observer; `status` says where it is
        logs = up.dispatch("logs", job)
        assert logs.code == 0, str(logs)
        assert logs.out == output.read_text()
        assert f"output: {output}" in record.out, str(record)
        output.unlink()
    finally:
        if job:
            with contextlib.suppress(Exception):
                run("scancel", f"--name=dj-{job}", check=False)
        up.close()
