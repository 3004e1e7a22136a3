"""What executions and scheduler commands start from (``dispatch_backends.environment``)."""

from __future__ import annotations

from dispatch_backends.environment import execution_base_env
from dispatch_backends.slurm.commands import Runner


def test_the_services_credentials_are_dropped_and_the_rest_kept() -> None:
    environ = {
        "PATH": "/usr/bin",
        "API_KEY": "a user's own",
        "API_NATS_PASSWORD": "p",
        "SUPERVISOR_NATS_CREDS_FILE": "/etc/dispatch/supervisor.creds",
        "OBSERVER_NATS_NKEY_SEED_FILE": "/etc/dispatch/observer.nk",
        "NOTIFIER_NATS_URL": "nats://x",
        "NOTIFIER_WEBHOOK_SECRET": "w",
        "API_TOKENS_FILE": "/etc/dispatch/tokens",
    }
    assert execution_base_env(environ) == {"PATH": "/usr/bin", "API_KEY": "a user's own"}


def test_slurm_commands_and_so_sbatch_export_all_get_no_credentials() -> None:
    env = Runner("lab", base_env={"PATH": "/usr/bin", "SUPERVISOR_NATS_PASSWORD": "p"}).env()
    assert "SUPERVISOR_NATS_PASSWORD" not in env
    assert env["PATH"] == "/usr/bin"
