"""Running Slurm's commands off the event loop, with timeouts, counted.

Each command is a subprocess (``asyncio.create_subprocess_exec``: the loop never blocks),
bounded by a semaphore (``max_concurrency``) and a timeout (``command_timeout_s``; the
process is killed when it passes). A command that can't reach slurmctld (or slurmdbd) is
recognised from Slurm's own words, listed in :data:`UNREACHABLE_WORDS`, and is
:class:`~dispatch_backends.protocol.Unreachable`; so is a command that is not installed.

The environment is the backend's own, plus ``SLURM_TIME_FORMAT=standard`` (ISO times, which
the parsers read) and ``SLURM_CONF`` when the settings name one, minus the variables that
would change what ``squeue``/``sacct``/``sinfo`` print (``SQUEUE_FORMAT``, ``SACCT_FORMAT``,
...).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Mapping, Sequence
from typing import Final

import msgspec

from dispatch_backends.environment import execution_base_env
from dispatch_backends.protocol import Unreachable

__all__ = [
    "UNREACHABLE_WORDS",
    "CommandResult",
    "CommandTimeout",
    "Runner",
    "join_ids",
    "unreachable_words",
]

log = logging.getLogger("dispatch_backends.slurm")

UNREACHABLE_WORDS: Final = (
    "Unable to contact slurm controller",
    "Socket timed out on send/recv operation",
    "Zero Bytes were transmitted or received",
    "Connection refused",
    "Communication connection failure",
    "Slurm backup controller in standby mode",
    "Unable to connect to database",
    "Problem talking to the database",
    "slurmdbd: Sending message to slurmdbd",
)
"""Words a Slurm client prints when it could not reach slurmctld or slurmdbd (the first is
the test cluster's, with slurmctld's port closed:
``slurm_load_jobs error: Unable to contact slurm controller (connect failure)``, after about
9 s of retries)."""

_DROPPED_ENV: Final = (
    "SQUEUE_FORMAT",
    "SQUEUE_FORMAT2",
    "SQUEUE_SORT",
    "SQUEUE_STATES",
    "SQUEUE_USERS",
    "SACCT_FORMAT",
    "SINFO_FORMAT",
    "SINFO_SORT",
    "SLURM_TIME_FORMAT",
)


def unreachable_words(text: str) -> str | None:
    """The first line of ``text`` that says the controller or database couldn't be
    reached, or ``None``."""
    for line in text.splitlines():
        if any(words in line for words in UNREACHABLE_WORDS):
            return line.strip()
    return None


class CommandResult(msgspec.Struct, frozen=True, kw_only=True):
    """What a command printed and returned.

    Attributes:
        argv: the command line.
        returncode: its exit status.
        stdout, stderr: its output, decoded (UTF-8, invalid bytes replaced).
        duration_s: wall seconds it took.
    """

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    duration_s: float

    @property
    def words(self) -> str:
        """stderr (else stdout), stripped: what the command said."""
        return (self.stderr or self.stdout).strip()


class CommandTimeout(Unreachable):
    """A command did not finish within its timeout and was killed; whether it did what it
    was asked is unknown (an ``sbatch`` may have made a job)."""


class Runner:
    """Runs Slurm commands for one cluster (see the module docstring)."""

    def __init__(
        self,
        cluster: str,
        *,
        timeout_s: float = 30.0,
        max_concurrency: int = 4,
        bin_dir: str = "",
        slurm_conf: str = "",
        base_env: Mapping[str, str] | None = None,
        run_as: Sequence[str] = (),
    ) -> None:
        """Run commands for ``cluster``.

        Args:
            cluster: the cluster name (in every error).
            timeout_s: seconds a command may take by default.
            max_concurrency: commands in flight at once.
            bin_dir: directory of the commands (empty: ``PATH``).
            slurm_conf: ``SLURM_CONF`` (empty: inherited).
            base_env: the environment (default: this process's, read at each call); the
                services' credentials are dropped from it either way (``sbatch --export=ALL``
                would hand them to the job: ``dispatch_backends.environment``).
            run_as: the prefix that runs a command as another user, ``{user}`` replaced
                (``sudo -n -u {user} --``; see :meth:`run`'s ``as_user``).
        """
        self.cluster = cluster
        self.timeout_s = timeout_s
        self.bin_dir = bin_dir
        self.slurm_conf = slurm_conf
        self.base_env = base_env
        self.run_as = tuple(run_as)
        self.extra_env: dict[str, str] = {}
        """Variables added to every command's environment (tests point ``SLURM_CONF`` at a
        config whose controller is unreachable)."""
        self._semaphore = asyncio.Semaphore(max_concurrency)
        self.calls = 0
        """Commands started since the backend was made."""

    def env(self) -> dict[str, str]:
        """The environment of the next command."""
        env = execution_base_env(os.environ if self.base_env is None else self.base_env)
        for name in _DROPPED_ENV:
            env.pop(name, None)
        env["SLURM_TIME_FORMAT"] = "standard"
        if self.slurm_conf:
            env["SLURM_CONF"] = self.slurm_conf
        env.update(self.extra_env)
        return env

    def program(self, name: str) -> str:
        """The path (or name) of Slurm command ``name``."""
        return os.path.join(self.bin_dir, name) if self.bin_dir else name

    async def run(
        self,
        name: str,
        *args: str,
        stdin: bytes | None = None,
        timeout_s: float | None = None,
        as_user: str | None = None,
    ) -> CommandResult:
        """Run Slurm command ``name`` with ``args``; return what it printed. With
        ``as_user``, it runs as that user through the ``run_as`` prefix (its argv starts
        with the prefix; a refusal by sudo is a non-zero exit with sudo's words).

        A non-zero exit is returned, not raised (callers read Slurm's words), unless the
        words say the controller could not be reached.

        Raises:
            Unreachable: the command is missing, could not be started, or said it could
                not reach slurmctld/slurmdbd.
            CommandTimeout: it did not finish in time (it was killed).
        """
        prefix: tuple[str, ...] = ()
        if as_user is not None:
            if not self.run_as:
                raise ValueError("no run_as prefix: can't run a command as another user")
            prefix = tuple(arg.replace("{user}", as_user) for arg in self.run_as)
        argv = (*prefix, self.program(name), *args)
        limit = self.timeout_s if timeout_s is None else timeout_s
        async with self._semaphore:
            self.calls += 1
            started = time.monotonic()
            try:
                proc = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=(
                        asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL
                    ),
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,
                    env=self.env(),
                    start_new_session=True,
                )
            except OSError as err:
                raise Unreachable(
                    self.cluster, f"cannot run {' '.join(argv[: len(prefix) + 1])}: {err}"
                ) from err
            try:
                out, err_out = await asyncio.wait_for(proc.communicate(stdin), limit)
            except TimeoutError:
                _kill_group(proc)
                with contextlib.suppress(Exception):
                    await proc.wait()
                raise CommandTimeout(
                    self.cluster, f"{name} did not finish within {limit:g} s (killed)"
                ) from None
            except asyncio.CancelledError:
                _kill_group(proc)
                raise
        result = CommandResult(
            argv=argv,
            returncode=proc.returncode if proc.returncode is not None else -1,
            stdout=out.decode(errors="replace"),
            stderr=err_out.decode(errors="replace"),
            duration_s=time.monotonic() - started,
        )
        log.debug(
            "slurm.command",
            extra={
                "argv": list(argv[: len(prefix) + 3]),
                "returncode": result.returncode,
                "duration_s": round(result.duration_s, 3),
            },
        )
        if result.returncode != 0:
            words = unreachable_words(result.stderr) or unreachable_words(result.stdout)
            if words is not None:
                raise Unreachable(self.cluster, f"{name}: {words}")
        return result


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL the command and anything it started (it runs in a session of its own)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def join_ids(ids: Sequence[str]) -> str:
    """Job ids as one ``-j`` argument."""
    return ",".join(ids)
