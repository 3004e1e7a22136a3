"""The ``local`` backend: each object is a process group on this machine (DESIGN.md section 7).

Modules: :mod:`.backend` (:class:`LocalBackend`), :mod:`.store` (the data directory),
:mod:`.files` (what its files hold), :mod:`.causes`, :mod:`.options`, :mod:`.faults`,
:mod:`.errors`, :mod:`.cli`; each object's runner is :mod:`dispatch_backends.local_runner`
(a standalone script, run by path).

It is the embedded default and the backend the end-to-end tests and benchmarks drive. It
behaves like a one-node scheduler, with a fault-injection interface that makes every path of
the seeds reachable here (preemption, node loss, foreign objects, admin holds, refused,
unknown and unreachable launches).

**Objects.** An object lives in ``<data dir>/objects/<id>/`` (ids are 1, 2, 3, ... per data
directory, like Slurm job ids), with its own runner process
(:mod:`dispatch_backends.local_runner`) that holds the start gate, runs the command and
records how it ended. Runners are detached from the backend, so objects survive a restart of
the backend's process: a new :class:`LocalBackend` on the same data directory discovers them
and can stop them. Files of an object directory:

* ``meta.json``: written once by :meth:`LocalBackend.start` (msgspec, atomically by rename):
  name ``dj-<job>``, submission, attempt, command, environment, limits, node.
* ``control/<marker>``: requests, written by the backend and by fault injection (``gate-open``,
  ``stop``, ``preempt``, ``emergency``, ``node-lost``, ``admin-hold``); the writer then wakes
  the runner with SIGUSR1 (no polling; see the runner's docstring).
* ``runner.json``, ``job.json``, ``terminating.json``, ``status.json``, ``ceased.json``: written
  by the runner; ``stdout``, ``stderr``, ``runner.log``: output.

**A start is idempotent per launch** (issue 15, "Launches survive the launcher"):
``<data dir>/attempts/<job>.<N>.<a>`` holds the id of the object a launch made, written under
the data directory's lock before anything else of the object. A second start of the same
launch (a supervisor restarted after dying in the middle of one) returns that object instead
of making another, and first gives it its runner if the dying process never did. An object
no runner ever owned is not shown by discovery: nothing can run it until a start does. The
runner never depends on the process that started it (it is re-parented, in a session of its
own, and a launcher gone before it said "ready" does not end it).

Liveness is checked by pid *and* start time (``/proc/<pid>/stat``), so a reused pid is never
taken for the runner or the command.

Runners are forked by the data directory's *zygote* (a warm runner process, one per data
directory, on an abstract Unix socket; it exits after ``zygote_idle_s`` idle seconds) when it
is up, which makes a start cost about a millisecond of CPU instead of an interpreter start;
when it is not, the runner is started directly and the zygote is started for the next ones.

**Environment of an execution.** The backend process's environment without the services'
credentials (``environment.execution_base_env``; or ``base_env``), then
``spec.env``, then dispatch's variables, which win over ``spec.env``: ``DISPATCH_JOB``,
``DISPATCH_SUBMISSION`` (N), ``DISPATCH_ATTEMPT`` (``<object id>-r0-<8 hex>``: opaque, unique
per execution even across data directories), ``DISPATCH_EPOCH`` (``epoch(G, N, 0)``: the local
backend never restarts an object natively, so R is always 0) and ``DISPATCH_CHECKPOINT`` (when
the spec has a checkpoint root).

**What runs.** ``spec.command``; or else ``spec.script``, written to the object directory and
run directly when it starts with ``#!``, else with ``/bin/sh``. The options it reads from
``spec.options`` (:data:`OPTIONS`):

* ``time``: the time limit, in **Slurm's format** so a spec means the same on both backends:
  ``M`` (minutes), ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``, ``D-H:M:S``; ``0``, ``UNLIMITED`` or
  ``INFINITE`` for none (:func:`~dispatch_backends.time_limit.parse_time_limit`). ``"0:05"``
  is five seconds. It counts from the gate opening; when it is reached the runner sends
  SIGTERM, waits the kill wait, then SIGKILL. A value that does not parse makes
  :meth:`LocalBackend.start` raise :class:`LaunchRefusedError`.
* ``chdir``: the working directory (default: the backend's ``workdir``, else its own current
  directory at start, as ``sbatch`` does).

A submission naming any other option, or a ``time`` that does not parse, is refused by
:func:`check_options` (the API calls it through :func:`dispatch_backends.check_options`), so
a typo such as ``partitionn`` is not silently ignored. :meth:`LocalBackend.start` itself still
ignores an option it doesn't read, so a job recorded before that check still launches.

``launch.exclude_nodes`` is ignored: there is one node, and excluding it after an injected
node loss would make every replacement unlaunchable.

**Causes** (``ObservedObject.cause`` of an ended object; details are verbatim strings):

=================================  =================  ===========  ============================
how it ended                       kind               provenance   detail / exit code
=================================  =================  ===========  ============================
exit 0                             ``none``           application  "exit code 0", exit_code 0
exit N                             ``non-zero-exit``  application  "exit code N", exit_code N
killed by signal S, not by us      ``unknown``        scheduler    "killed by signal 9
                                                                   (SIGKILL)", exit_code None
time limit                         ``time-limit``     scheduler    "time limit 5 s reached"
:meth:`~LocalBackend.stop`         ``cancelled``      scheduler    "stopped by dispatch
                                                                   (SIGTERM)" / "(SIGKILL after
                                                                   kill wait 10 s)" / "before
                                                                   start"
emergency stop                     ``cancelled``      scheduler    "emergency stop by dispatch
                                                                   (SIGKILL)"
preempt (fault injection)          ``preempted``      scheduler    "preempted by fault
                                                                   injection"
node-lost (fault injection)        ``node-lost``      scheduler    "node local not responding
                                                                   (fault injection)"
command can't be executed          ``launch-failed``  scheduler    "cannot execute 'x': ..."
runner vanished (kill -9)          ``unknown``        scheduler    "runner vanished; exit status
                                                                   lost"
=================================  =================  ===========  ============================

A process killed by a signal has no exit code (the shell's 128+S is the shell's own
convention; recording it would make ``kill -9`` indistinguishable from ``exit(137)``), and the
local backend cannot tell an OOM kill from any other SIGKILL (no cgroup per object), so it
reports ``unknown`` with the signal in the detail rather than guess ``out-of-memory``
(seed 000: never stretch the list). When a stopped process exits with a code of its own
(a SIGTERM handler calling ``exit(0)``), that code is kept in ``exit_code``.

**Node loss** (fault injection): the process keeps running and the object keeps reporting
phase ``running`` with cause ``node-lost`` (``at`` = the injection time), whatever the process
does, as a Kubeflow job on a lost node does; only :meth:`~LocalBackend.stop` or
:meth:`~LocalBackend.emergency_stop` (dispatch's fence) ends it, and its end is then reported
with cause ``node-lost``. ``recover-node`` takes the injection back.

**Ended objects** stay visible for ``retain_ended_s`` seconds (as Slurm's ``MinJobAge``), then
:meth:`~LocalBackend.discover` moves them to ``<data dir>/archive/`` and no longer shows them.

**Fault injection** (:class:`Faults` in-process, or from any process)::

    python -m dispatch_backends.local inject --data-dir D preempt OBJECT_ID
    python -m dispatch_backends.local inject --data-dir D node-lost OBJECT_ID
    python -m dispatch_backends.local inject --data-dir D recover-node OBJECT_ID
    python -m dispatch_backends.local inject --data-dir D foreign JOB_ID   # prints the id
    python -m dispatch_backends.local inject --data-dir D admin-hold OBJECT_ID
    python -m dispatch_backends.local inject --data-dir D admin-release OBJECT_ID
    python -m dispatch_backends.local inject --data-dir D refuse-next [--count N] [--detail W]
    python -m dispatch_backends.local inject --data-dir D unknown-next [--count N]
    python -m dispatch_backends.local inject --data-dir D die-in-start-next [--count N]
    python -m dispatch_backends.local inject --data-dir D unreachable-next [--count N]
                                                                     [--call CALL]
    python -m dispatch_backends.local inject --data-dir D unreachable (on|off)
    python -m dispatch_backends.local inject --data-dir D clear
    python -m dispatch_backends.local list --data-dir D [--cluster C]  # one JSON line each
    python -m dispatch_backends.local kill-all --data-dir D            # SIGKILL everything

Launch faults live in ``<data dir>/faults.json`` (changed under a lock, so counted faults are
consumed exactly once across processes): ``refuse-next`` makes the next start raise
:class:`LaunchRefusedError` (nothing created); ``unknown-next`` creates the object and then
raises :class:`LaunchUnknownError`; ``die-in-start-next`` makes the next start SIGKILL its
own process (the supervisor) once the runner was asked for, before it said "ready";
``unreachable-next`` makes the next call (of any kind, or of
``--call start|open-gate|stop|discover|cessation|emergency-stop``) raise :class:`Unreachable`
having done nothing; ``unreachable on`` makes every call raise it until ``off``.
"""

from dispatch_backends.local.backend import LocalBackend
from dispatch_backends.local.cli import main
from dispatch_backends.local.errors import AdminHeldError, FaultError, ObjectNotFound
from dispatch_backends.local.faults import CALLS, Faults, kill_all
from dispatch_backends.local.options import OPTIONS, check_options
from dispatch_backends.time_limit import parse_time_limit

__all__ = [
    "CALLS",
    "OPTIONS",
    "AdminHeldError",
    "FaultError",
    "Faults",
    "LocalBackend",
    "ObjectNotFound",
    "check_options",
    "kill_all",
    "main",
    "parse_time_limit",
]
