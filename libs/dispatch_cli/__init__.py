"""dispatch_cli: the ``dispatch`` command (DESIGN.md section 1).

``dispatch up`` runs every part of dispatch on this machine (:mod:`dispatch_cli.embedded`);
``dispatch demo`` shows a training job preempted and resumed (:mod:`dispatch_cli.demo`);
every other command is a thin client of the HTTP API (:mod:`dispatch_cli.client`). Exit
codes are documented in :mod:`dispatch_cli.errors`.
"""

from dispatch_cli.errors import ApiError, CliError, Unreachable, UsageError
from dispatch_cli.main import cli, main

__all__ = ["ApiError", "CliError", "Unreachable", "UsageError", "cli", "main"]
