"""Jobs run as their owners (issue 16 item 1), the parts without a cluster: the settings'
``users``/``run_as``, the command runner's prefix, the tokens file's ``unix_user``, and the
shipped sudoers rule (checked by sudo's own ``visudo``)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Final

import msgspec
import pytest

from dispatch_backends.slurm import SlurmSettings
from dispatch_backends.slurm.commands import Runner
from dispatch_core import ActorKind
from services.api.auth import Authenticator, TokenEntry
from services.common.config import ConfigError

REPO: Final = Path(__file__).resolve().parents[3]


def test_an_owner_is_refused_unless_the_cluster_lists_it() -> None:
    listed = SlurmSettings(users=("alice", "bob"))
    assert listed.refuse_owner("") is None
    assert listed.refuse_owner("alice") is None
    assert listed.refuse_owner("carol") == (
        "dispatch may not act for Unix user 'carol' on this cluster (its users: alice, bob)"
    )
    none = SlurmSettings()
    refused = none.refuse_owner("alice")
    assert refused is not None
    assert "runs every job as dispatch's own user" in refused


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        ({"users": ["-rf"]}, "'-rf' is not a user name"),
        ({"users": ["a b"]}, "'a b' is not a user name"),
        ({"users": ["alice"], "run_as": ["sudo", "-n", "--"]}, "run_as must contain {user}"),
    ],
)
def test_bad_users_and_run_as_are_refused(settings: dict[str, object], words: str) -> None:
    with pytest.raises(msgspec.ValidationError, match=words):
        msgspec.convert(settings, SlurmSettings)


async def test_the_runner_runs_a_command_as_a_user_through_the_prefix(tmp_path: Path) -> None:
    """The prefix (here ``env DISPATCH_AS={user}``, standing in for sudo) comes first, with
    ``{user}`` replaced; without ``as_user`` the command runs as it is."""
    runner = Runner("c", bin_dir="/bin", run_as=("env", "DISPATCH_AS={user}"))
    shown = await runner.run("sh", "-c", 'echo "as=$DISPATCH_AS"', as_user="alice")
    assert shown.argv[:2] == ("env", "DISPATCH_AS=alice")
    assert shown.stdout.strip() == "as=alice"
    plain = await runner.run("sh", "-c", 'echo "as=${DISPATCH_AS:-}"')
    assert plain.argv[0] == "/bin/sh"
    assert plain.stdout.strip() == "as="
    with pytest.raises(ValueError, match="no run_as prefix"):
        await Runner("c").run("true", as_user="alice")


def test_the_tokens_file_maps_actors_to_unix_users_and_refuses_two_for_one_actor() -> None:
    entries = (
        TokenEntry(actor="alice", kind=ActorKind.HUMAN, token="a1", unix_user="alice"),
        TokenEntry(actor="alice", kind=ActorKind.HUMAN, token="a2", unix_user="alice"),
        TokenEntry(actor="oncall", kind=ActorKind.HUMAN, token="o1"),
    )
    auth = Authenticator.from_entries(entries)
    assert dict(auth.unix_users) == {"alice": "alice"}
    clash = (
        *entries,
        TokenEntry(actor="alice", kind=ActorKind.HUMAN, token="a3", unix_user="root"),
    )
    with pytest.raises(ConfigError, match=r"tokens\[3\].*unix_user 'root' differs from 'alice'"):
        Authenticator.from_entries(clash)
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert(
            {"actor": "x", "kind": "human", "token": "t", "unix_user": "-x"}, TokenEntry
        )


def test_the_shipped_sudoers_rule_parses_and_grants_only_three_commands() -> None:
    visudo = shutil.which("visudo") or "/usr/sbin/visudo"
    assert Path(visudo).exists(), "visudo missing: scripts/slurm-cluster.sh start installs sudo"
    rule = REPO / "deploy" / "slurm" / "sudoers.dispatch"
    checked = subprocess.run([visudo, "-cf", str(rule)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    grants = [line for line in rule.read_text().splitlines() if line and not line.startswith("#")]
    assert grants[0] == (
        "Cmnd_Alias DISPATCH_SLURM = /usr/bin/sbatch, /usr/bin/scontrol release *, /usr/bin/scancel"
    )
    assert grants[-1] == "dispatch ALL = (%dispatch-users) NOPASSWD: DISPATCH_SLURM"
    dropin = REPO / "deploy/systemd/dispatch-supervisor.service.d/run-as-owners.conf"
    assert "NoNewPrivileges=no" in dropin.read_text().splitlines()
