"""The environment an execution starts from: the backend process's, without dispatch's secrets.

A backend runs inside a dispatch service (the supervisor launches, the observer polls), and
that service's environment holds its own identity: ``SUPERVISOR_NATS_PASSWORD``, the paths of
its NATS credentials and keys, the API's token file, the notifier's webhook secret. A job that
inherited them could append to the record as the supervisor (issue 10: "nothing may reach
dispatch without its own identity"). The local backend starts every execution from this
environment, and the Slurm backend runs its commands in it (``sbatch --export=ALL`` hands it to
the job).

Dropped: every variable whose name starts with one of :data:`SERVICE_SECRET_PREFIXES`. Kept:
everything else (``PATH``, ``HOME``, the site's ``CUDA_*``, a user's ``API_KEY``...).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

__all__ = ["SERVICE_SECRET_PREFIXES", "execution_base_env"]

SERVICE_SECRET_PREFIXES: Final = (
    "API_NATS_",
    "SUPERVISOR_NATS_",
    "NOTIFIER_NATS_",
    "OBSERVER_NATS_",
    "API_TOKENS",
    "NOTIFIER_",
)
"""Name prefixes of the services' settings that hold or point to credentials: every
service's NATS connection settings (``services/common/nats_settings.py``), the API's token
file and all of the notifier's settings (webhook secret, Slack URL, SMTP)."""


def execution_base_env(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without the dispatch services' credential settings.

    Args:
        environ: a process environment (usually ``os.environ``).

    Returns:
        A new dict: every entry of ``environ`` whose name does not start with one of
        :data:`SERVICE_SECRET_PREFIXES`.
    """
    return {k: v for k, v in environ.items() if not k.startswith(SERVICE_SECRET_PREFIXES)}
