"""The slurm backend: each of dispatch's objects is one Slurm batch job (DESIGN.md section 7).

See the package docstring for the whole picture; this module is the I/O, through
:class:`~dispatch_backends.slurm.commands.Runner` (subprocesses, off the event loop, with
timeouts).

**Calls per poll.** :meth:`SlurmBackend.discover` runs one ``squeue`` for every job of the
user; then, when dispatch has any job on the cluster or any job it last saw alive is no
longer listed, one ``sinfo`` (node states, for lost nodes) and one ``sacct --duplicates -j
<ids>`` (job *and* step rows; ``sacct -c`` with ``accounting = "jobcomp"``; none with
``"none"``) for all of them at once: the jobs squeue lists and the gone ones together. So a
poll is 3 commands (1 with nothing to ask about), however many jobs there are:
``Snapshot.calls``, which the observer exports as
``dispatch_observer_scheduler_calls_per_poll``. A sacct that fails (slurmdbd down) costs
nothing but its answers: causes wait for it, within the grace, and no gone job is decided.
"""

from __future__ import annotations

import asyncio
import logging
import pwd
import secrets
from collections.abc import Callable, Collection
from datetime import UTC, datetime
from typing import Final

from dispatch_backends.protocol import (
    BackendError,
    CessationAnswer,
    LaunchRefusedError,
    LaunchUnknownError,
    Snapshot,
    Unreachable,
)
from dispatch_backends.slurm.causes import ADMIN_HOLD, USER_HOLDS
from dispatch_backends.slurm.commands import CommandResult, CommandTimeout, Runner
from dispatch_backends.slurm.observe import Memory, dispatch_job_id, observe_all, observe_gone
from dispatch_backends.slurm.parse import (
    ACCT_FIELDS,
    JOBCOMP_FIELDS,
    QUEUE_FIELDS,
    SINFO_FIELDS,
    AcctRow,
    NodeState,
    ParseError,
    QueueJob,
    parse_sacct,
    parse_sinfo,
    parse_squeue_json,
    parse_squeue_text,
)
from dispatch_backends.slurm.resume import ResumeStep, find_launch, resume_step
from dispatch_backends.slurm.script import InvalidSpec, submission
from dispatch_backends.slurm.settings import Accounting, QueueFormat, SlurmSettings
from dispatch_core.state import Action, Declarations, ObjectRef
from dispatch_core.steps import Launch

__all__ = [
    "AdminHeldError",
    "ObjectNotFound",
    "SlurmBackend",
    "SlurmBackendWithCessation",
    "make_slurm_backend",
]

log = logging.getLogger("dispatch_backends.slurm")

_QUEUE_FORMAT: Final = ",".join(f"{field}:|" for field in QUEUE_FIELDS)
_ACCT_FORMAT: Final = ",".join(ACCT_FIELDS)
_JOBCOMP_FORMAT: Final = ",".join(JOBCOMP_FIELDS)
_SINFO_FORMAT: Final = ",".join(f"{field}:|" for field in SINFO_FIELDS)
_INVALID_JOB: Final = "Invalid job id specified"
_MAYBE_MADE: Final = ("Socket timed out", "Zero Bytes were transmitted")
"""sbatch words after which the request may have reached slurmctld: the outcome is unknown."""


class ObjectNotFound(BackendError):
    """slurmctld has no job with that id (never made, or gone after ``MinJobAge``)."""

    def __init__(self, cluster: str, object_id: str) -> None:
        super().__init__(cluster, f"no Slurm job {object_id}")
        self.object_id = object_id


class AdminHeldError(BackendError):
    """:meth:`SlurmBackend.open_gate` was asked to open a gate an administrator holds
    (``JobHeldAdmin``); dispatch never releases that one (seed 002)."""

    def __init__(self, cluster: str, object_id: str) -> None:
        super().__init__(cluster, f"Slurm job {object_id} is held by an administrator")
        self.object_id = object_id


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _user_name(uid: int) -> str | None:
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return None


def _current_user() -> str:
    import getpass

    return getpass.getuser()


class SlurmBackend:
    """dispatch's objects as Slurm batch jobs on one cluster (see the package docstring).

    Implements :class:`~dispatch_backends.protocol.Backend` and
    :class:`~dispatch_backends.protocol.EmergencyStopper`;
    :class:`SlurmBackendWithCessation` adds the cessation signal (built by
    :func:`make_slurm_backend` when the settings name a command).
    """

    def __init__(
        self,
        cluster: str,
        settings: SlurmSettings | None = None,
        *,
        clock: Callable[[], datetime] = _utcnow,
        runner: Runner | None = None,
    ) -> None:
        """Serve ``cluster``.

        Args:
            cluster: the cluster name (part of every ref).
            settings: its settings (default: :class:`SlurmSettings` defaults).
            clock: the time (timezone-aware), for windows and graces.
            runner: the command runner (default: one built from the settings).
        """
        self._cluster = cluster
        self._settings = settings or SlurmSettings()
        self._clock = clock
        self._runner = runner or Runner(
            cluster,
            timeout_s=self._settings.command_timeout_s,
            max_concurrency=self._settings.max_concurrency,
            bin_dir=self._settings.bin_dir,
            slurm_conf=self._settings.slurm_conf,
            run_as=self._settings.run_as,
        )
        self._user = self._settings.user or _current_user()
        self._users = tuple(dict.fromkeys((self._user, *self._settings.users)))
        """Whose jobs discovery lists: the backend's user and every owner it may act for."""
        self._memory = Memory()
        self._lock = asyncio.Lock()

    # -- the Backend protocol -----------------------------------------------------------------

    @property
    def cluster(self) -> str:
        """The cluster name."""
        return self._cluster

    @property
    def settings(self) -> SlurmSettings:
        """The backend's settings."""
        return self._settings

    @property
    def commands(self) -> Runner:
        """The command runner (its ``calls`` counts every Slurm command run)."""
        return self._runner

    def declarations(self) -> Declarations:
        """The node-loss window (settings), ``requeue`` enforced natively (Slurm requeues a
        requeueable job on preemption in REQUEUE mode and on node failure), the emergency
        stop, and the cessation signal when a command is configured (and the backend was
        built by :func:`make_slurm_backend`, which gives it the method)."""
        return Declarations(
            node_loss_window_s=self._settings.node_loss_window_s,
            native_actions=frozenset({Action.REQUEUE}),
            cessation_signal=bool(self._settings.cessation_command) and hasattr(self, "cessation"),
            emergency_stop=True,
            idempotent_start=True,
        )

    async def start(self, launch: Launch) -> ObjectRef:
        """Submit ``launch`` with ``sbatch --hold`` (the closed gate); return its job id. A
        repeated start of a launch whose outcome was lost (``launch.resume``) first looks for
        the job an earlier sbatch of it made (:mod:`.resume`): idempotent per attempt.

        Raises:
            LaunchRefusedError: the spec can't be submitted, or sbatch said no (its words).
            LaunchUnknownError: sbatch timed out, lost its connection mid-request, or
                printed no job id: a job may exist (discovery finds it by its comment).
            Unreachable: sbatch could not reach slurmctld (nothing was made).
        """
        refused = self._settings.refuse_owner(launch.spec.owner)
        if refused is not None:
            raise LaunchRefusedError(self._cluster, refused)
        if launch.resume:
            made = await self._made_by_a_cut_off_sbatch(launch)
            if made is not None:
                return made
        token = secrets.token_hex(4)
        exclude = launch.exclude_nodes if self._settings.exclude_lost_nodes else ()
        try:
            sub = submission(launch, self._settings, token, exclude=exclude)
        except InvalidSpec as err:
            raise LaunchRefusedError(self._cluster, str(err)) from err
        try:
            result = await self._runner.run(
                "sbatch",
                *sub.args,
                stdin=sub.script.encode(),
                as_user=self._as(launch.spec.owner),
            )
        except CommandTimeout as err:
            raise LaunchUnknownError(self._cluster, err.detail) from err
        except Unreachable as err:
            if any(words in err.detail for words in _MAYBE_MADE):
                raise LaunchUnknownError(self._cluster, err.detail) from err
            raise
        if result.returncode != 0:
            raise LaunchRefusedError(self._cluster, result.words or "sbatch failed")
        job_id = result.stdout.strip().split(";", 1)[0]
        if not job_id.isdigit():
            raise LaunchUnknownError(
                self._cluster, f"sbatch printed no job id: {result.stdout.strip()!r}"
            )
        log.info(
            "slurm.job.submitted",
            extra={
                "job_id": launch.intent.job_id,
                "slurm_job": job_id,
                "submission": launch.submission,
                "attempt": launch.attempt,
                "owner": launch.spec.owner or self._user,
            },
        )
        return ObjectRef(cluster=self._cluster, id=job_id)

    def _as(self, user: str) -> str | None:
        """The user a command for a job of ``user`` runs as through ``run_as``: ``None``
        (as the backend itself) for no owner, the backend's own user, or a user it may not
        act for (then Slurm itself says no, in its words)."""
        if not user or user == self._user or user not in self._settings.users:
            return None
        return user

    async def _owner_of(self, ref: ObjectRef) -> str | None:
        """The owner a release or cancel of ``ref`` runs as: the Slurm job's own user
        (squeue), when the backend acts for owners at all; ``None`` otherwise, or when
        slurmctld no longer knows the job."""
        if not self._settings.users:
            return None
        try:
            _, _, user = await self._queue_state(ref)
        except ObjectNotFound:
            return None
        return self._as(user)

    async def _made_by_a_cut_off_sbatch(self, launch: Launch) -> ObjectRef | None:
        """For a repeated start of a launch (``Launch.resume``): the job an earlier, cut-off
        sbatch of it made, found by its tag in ``squeue``; ``None`` when a new sbatch may be
        run (see :mod:`.resume`).

        Raises:
            LaunchUnknownError: an earlier sbatch may still be running, or the intent is
                older than MinJobAge and squeue lists no job of it (nothing was submitted).
            Unreachable: squeue could not reach slurmctld (nothing was submitted).
        """
        settings = self._settings
        age_s = (self._clock() - launch.intent.at).total_seconds()
        step = resume_step(
            age_s, sbatch_settle_s=settings.sbatch_settle_s, min_job_age_s=settings.min_job_age_s
        )
        if step is ResumeStep.WAIT:
            raise LaunchUnknownError(
                self._cluster,
                f"an sbatch of this launch cut off {age_s:.0f} s ago may still be running; "
                f"it is looked for {settings.sbatch_settle_s:g} s after the intent",
            )
        found = find_launch(
            await self._squeue(), launch.intent.job_id, launch.submission, launch.attempt
        )
        if found is not None:
            log.info(
                "slurm.job.found_again",
                extra={
                    "job_id": launch.intent.job_id,
                    "slurm_job": found,
                    "submission": launch.submission,
                    "attempt": launch.attempt,
                },
            )
            return ObjectRef(cluster=self._cluster, id=found)
        if step is ResumeStep.LOOK_ONLY:
            raise LaunchUnknownError(
                self._cluster,
                f"squeue lists no job of this launch, but its intent is {age_s:.0f} s old, "
                f"past MinJobAge ({settings.min_job_age_s:g} s): a job a cut-off sbatch made "
                "may have ended and been forgotten",
            )
        return None

    async def _queue_state(self, ref: ObjectRef) -> tuple[str, str, str]:
        """(State, Reason, UserName) of ``ref`` from squeue."""
        result = await self._runner.run(
            "squeue", "-h", "-t", "all", "-j", ref.id, "-O", "State:|,Reason:|,UserName:|"
        )
        if result.returncode != 0:
            if _INVALID_JOB in result.words:
                raise ObjectNotFound(self._cluster, ref.id)
            raise BackendError(self._cluster, f"squeue -j {ref.id}: {result.words}")
        line = result.stdout.strip()
        if not line:
            raise ObjectNotFound(self._cluster, ref.id)
        state, reason, user = ([*line.split("|"), "", ""])[:3]
        return state.strip(), reason.strip(), user.strip()

    async def open_gate(self, ref: ObjectRef) -> None:
        """Open dispatch's gate: ``scontrol release`` of a job held by its user hold
        (``JobHeldUser``). A job that is not held (released, running, ended) is left alone;
        an administrator's hold is never released (``scontrol release`` as root would
        release it too, so the reason is checked first).

        Raises:
            AdminHeldError: ``JobHeldAdmin``.
            ObjectNotFound: slurmctld doesn't know the job.
            Unreachable: slurmctld can't be reached.
        """
        state, reason, user = await self._queue_state(ref)
        if reason == ADMIN_HOLD:
            raise AdminHeldError(self._cluster, ref.id)
        if state != "PENDING" or reason not in USER_HOLDS:
            return
        result = await self._runner.run("scontrol", "release", ref.id, as_user=self._as(user))
        if result.returncode != 0 and "already finished" not in result.words:
            raise BackendError(self._cluster, f"scontrol release {ref.id}: {result.words}")
        log.info("slurm.gate.opened", extra={"slurm_job": ref.id})

    async def stop(self, ref: ObjectRef) -> None:
        """``scancel`` (SIGTERM, ``KillWait``, SIGKILL; a pending job ends without running).
        scancel exits 0 for an unknown or finished job (lab trap), so stopping one that
        ended is not an error.

        Raises:
            Unreachable: slurmctld can't be reached.
            BackendError: scancel said no.
        """
        await self._scancel(ref, await self._owner_of(ref))
        log.info("slurm.job.stopping", extra={"slurm_job": ref.id})

    async def _scancel(self, ref: ObjectRef, owner: str | None, *args: str) -> None:
        result = await self._runner.run("scancel", *args, ref.id, as_user=owner)
        if result.returncode != 0 and _INVALID_JOB not in result.words:
            raise BackendError(self._cluster, f"scancel {ref.id}: {result.words}")

    async def emergency_stop(self, ref: ObjectRef) -> None:
        """``scancel --signal=KILL --full`` (SIGKILL to the batch script, its children and
        every step), then ``scancel`` (which ends a job still pending).

        Measured on 22.05 with ``proctrack/linuxproc`` (see ``examples/slurm/README.md``):
        slurmctld turns a SIGKILL of the whole job into its normal termination, so the
        processes still get SIGTERM and the kill wait; ``--batch`` would kill the batch
        shell at once but let its children escape, so it is not used.

        Raises:
            Unreachable: slurmctld can't be reached.
        """
        owner = await self._owner_of(ref)
        await self._runner.run("scancel", "--signal=KILL", "--full", ref.id, as_user=owner)
        await self._scancel(ref, owner)
        log.info("slurm.job.emergency_stop", extra={"slurm_job": ref.id})

    async def discover(self, expected: Collection[ObjectRef] = ()) -> Snapshot:
        """Every job of dispatch's on the cluster, from at most 3 commands (see the module
        docstring).

        Args:
            expected: objects the caller last saw alive on this cluster (kept across its
                polls and restarts). Each one squeue no longer lists, like each one this
                backend last saw alive, is looked up in accounting in the same sacct call:
                reported ended with accounting's cause, or listed in ``Snapshot.vanished``
                when accounting has no end for it (after ``accounting_grace_s``).

        Raises:
            Unreachable: squeue or sinfo could not reach slurmctld, or printed what can't be
                parsed (the poll changes nothing).
        """
        async with self._lock:
            return await self._discover(expected)

    async def _discover(self, expected: Collection[ObjectRef]) -> Snapshot:
        before = self._runner.calls
        now = self._clock()
        jobs = await self._squeue()
        own = [j for j in jobs if dispatch_job_id(j.name) is not None]
        listed = {j.raw_id for j in jobs}
        wanted = set(self._memory.alive) | {
            ref.id for ref in expected if ref.cluster == self._cluster and ref.id.isdigit()
        }
        gone = sorted(wanted - listed, key=int)
        nodes: dict[str, NodeState] | None = None
        rows: list[AcctRow] | None = None
        if own or gone:
            nodes, rows = await asyncio.gather(
                self._sinfo(), self._sacct([j.raw_id for j in own] + gone)
            )
        objects = observe_all(
            own,
            rows,
            nodes,
            cluster=self._cluster,
            now=now,
            memory=self._memory,
            accounting=self._settings.accounting,
            grace_s=self._settings.accounting_grace_s,
            user_name=_user_name,
        )
        ended, vanished = observe_gone(
            [ObjectRef(cluster=self._cluster, id=raw_id) for raw_id in gone],
            rows,
            now=now,
            memory=self._memory,
            accounting=self._settings.accounting,
            grace_s=self._settings.accounting_grace_s,
            user_name=_user_name,
        )
        for job_id, found in ended.items():
            objects[job_id] = (*objects.get(job_id, ()), *found)
        if ended or vanished:
            log.info(
                "slurm.gone",
                extra={
                    "ended": sorted(o.ref.id for objs in ended.values() for o in objs),
                    "vanished": [ref.id for ref in vanished],
                },
            )
        return Snapshot(
            cluster=self._cluster,
            seen_at=now,
            objects=objects,
            calls=self._runner.calls - before,
            vanished=vanished,
        )

    async def _squeue(self) -> list[QueueJob]:
        if self._settings.queue_format is QueueFormat.JSON:
            result = await self._runner.run("squeue", "--json")
            self._check(result)
            try:
                return [j for j in parse_squeue_json(result.stdout) if j.user in self._users]
            except ParseError as err:
                raise Unreachable(self._cluster, f"squeue --json: {err}") from err
        result = await self._runner.run(
            "squeue", "-h", "-t", "all", "-u", ",".join(self._users), "-O", _QUEUE_FORMAT
        )
        self._check(result)
        try:
            return parse_squeue_text(result.stdout)
        except ParseError as err:
            raise Unreachable(self._cluster, f"squeue: {err}") from err

    async def _sinfo(self) -> dict[str, NodeState]:
        result = await self._runner.run("sinfo", "-h", "-N", "-O", _SINFO_FORMAT)
        self._check(result)
        try:
            return parse_sinfo(result.stdout)
        except ParseError as err:
            raise Unreachable(self._cluster, f"sinfo: {err}") from err

    async def _sacct(self, raw_ids: list[str]) -> list[AcctRow] | None:
        """sacct's job and step rows for ``raw_ids`` (every job asked about: one call), or
        ``None`` when accounting is off or couldn't be read this poll (then causes wait,
        within the grace)."""
        accounting = self._settings.accounting
        if accounting is Accounting.NONE:
            return None
        ids = ",".join(sorted(set(raw_ids), key=int))
        jobcomp = accounting is Accounting.JOBCOMP
        fields = JOBCOMP_FIELDS if jobcomp else ACCT_FIELDS
        args = ["-P", "-n", "--duplicates", "-o", _JOBCOMP_FORMAT if jobcomp else _ACCT_FORMAT]
        args += ["-j", ids]
        if jobcomp:
            args.insert(0, "-c")
        try:
            result = await self._runner.run("sacct", *args)
        except Unreachable as err:
            log.warning("slurm.sacct.unreachable", extra={"detail": err.detail})
            return None
        if result.returncode != 0:
            log.warning("slurm.sacct.failed", extra={"detail": result.words})
            return None
        try:
            return parse_sacct(result.stdout, fields)
        except ParseError as err:
            log.warning("slurm.sacct.unreadable", extra={"detail": str(err)})
            return None

    def _check(self, result: CommandResult) -> None:
        if result.returncode != 0:
            raise Unreachable(
                self._cluster, f"{result.argv[0]} exited {result.returncode}: {result.words}"
            )


class SlurmBackendWithCessation(SlurmBackend):
    """A :class:`SlurmBackend` with the site's cessation signal (seed 004): the settings'
    ``cessation_command``."""

    async def cessation(self, ref: ObjectRef, nodes: tuple[str, ...]) -> CessationAnswer:
        """Run the site's command with ``{job_id}`` and ``{nodes}`` substituted; exit 0 means
        the processes are gone. A command that fails to run or times out answers "not
        ceased" with the reason (a person may still decide)."""
        argv = [
            arg.replace("{job_id}", ref.id).replace("{nodes}", ",".join(nodes))
            for arg in self._settings.cessation_command
        ]
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
            )
        except OSError as err:
            return CessationAnswer(ceased=False, detail=f"cannot run {argv[0]}: {err}")
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), self._settings.cessation_timeout_s)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            return CessationAnswer(
                ceased=False,
                detail=f"{argv[0]} did not answer within {self._settings.cessation_timeout_s:g} s",
            )
        words = out.decode(errors="replace").strip()[-500:]
        code = proc.returncode
        return CessationAnswer(
            ceased=code == 0,
            detail=f"{argv[0]} exited {code}" + (f": {words}" if words else ""),
        )


def make_slurm_backend(cluster: str, settings: SlurmSettings) -> SlurmBackend:
    """The backend for ``cluster``: with the cessation signal exactly when the settings
    name a command (so ``declarations().cessation_signal`` matches the interface)."""
    if settings.cessation_command:
        return SlurmBackendWithCessation(cluster, settings)
    return SlurmBackend(cluster, settings)
