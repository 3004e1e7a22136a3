"""The shipped sudoers rule (``deploy/slurm/sudoers.dispatch``), on the real Slurm test
cluster, for a service user that is not root (issue 16 item 1).

``scripts/slurm-cluster.sh start`` installs the rule for its service user ``dj-dispatch``
(``/etc/sudoers.d/dispatch-test``) with the owners ``dj-alice`` and ``dj-bob`` in group
``dispatch-users``. The backend's ``run_as`` is ``runuser -u dj-dispatch -- sudo -n -u
{user} --``: every command it runs as an owner is run by ``dj-dispatch`` through sudo, as
under the systemd unit. Shown: a job is submitted, released and cancelled as ``dj-alice``
(Slurm's accounting says ``CANCELLED by <dj-alice's uid>``), and sudo itself refuses an owner
outside the group (root, even when the clusters file were to list it): the launch is
refused with sudo's words.
"""

from __future__ import annotations

import os
import pwd
import secrets
from typing import Final

import pytest

from dispatch_backends.protocol import LaunchRefusedError
from dispatch_backends.slurm import SlurmBackend, SlurmSettings
from dispatch_core import JobSpec
from tests.contract.backend_contract import make_launch
from tests.integration.slurm.test_slurm_support import require_cluster, run
from tests.util import assert_eventually

pytestmark = [pytest.mark.slurm, pytest.mark.integration, pytest.mark.e2e]

SERVICE: Final = "dj-dispatch"
RUN_AS: Final = ("runuser", "-u", SERVICE, "--", "sudo", "-n", "-u", "{user}", "--")
SCRIPT: Final = "#!/bin/sh\n#SBATCH -p debug\n#SBATCH --time=5\n#SBATCH --mem=50M\nexec sleep 300\n"


def _squeue(slurm_id: str) -> tuple[str, str]:
    line = run("squeue", "-h", "-t", "all", "-j", slurm_id, "-o", "%u|%T").stdout.strip()
    assert line.count("|") == 1, line
    user, state = line.split("|")
    return user, state


def _sacct(slurm_id: str) -> tuple[str, str]:
    line = run("sacct", "-n", "-P", "-X", "-j", slurm_id, "-o", "User,State").stdout.strip()
    assert line.count("|") == 1, line
    user, state = line.split("|")
    assert state.startswith("CANCELLED"), state
    return user, state


@pytest.mark.timeout(300)
async def test_the_service_user_acts_for_an_owner_only_through_the_sudoers_rule() -> None:
    require_cluster()
    _require_rule()
    backend = SlurmBackend(
        "lab",
        SlurmSettings(
            user=SERVICE,
            users=("dj-alice", "dj-bob", "root"),
            run_as=RUN_AS,
            output_dir="/tmp",
            workdir="/tmp",
        ),
    )
    job = f"sudo-{secrets.token_hex(3)}"
    spec = JobSpec(cluster="lab", script=SCRIPT, owner="dj-alice")
    ref = await backend.start(make_launch(job, spec))
    try:
        assert _squeue(ref.id) == ("dj-alice", "PENDING")
        await backend.open_gate(ref)
        await assert_eventually(lambda: _is(_squeue(ref.id), ("dj-alice", "RUNNING")), timeout_s=60)
        await backend.stop(ref)
        uid = pwd.getpwnam("dj-alice").pw_uid
        ended = await assert_eventually(lambda: _sacct(ref.id), timeout_s=90, interval_s=1.0)
        assert ended == ("dj-alice", f"CANCELLED by {uid}")
    finally:
        run("scancel", ref.id, check=False)

    # sudo refuses what the rule doesn't grant: root is not in dispatch-users
    as_root = JobSpec(cluster="lab", script=SCRIPT, owner="root")
    with pytest.raises(LaunchRefusedError, match="sudo: a password is required"):
        await backend.start(make_launch(f"{job}-root", as_root))
    assert run("squeue", "-h", "-t", "all", "-n", f"dj-{job}-root").stdout.strip() == ""


def _is(got: tuple[str, str], want: tuple[str, str]) -> None:
    assert got == want, got


def _require_rule() -> None:
    assert os.path.exists("/etc/sudoers.d/dispatch-test"), "slurm-cluster.sh start installs it"
