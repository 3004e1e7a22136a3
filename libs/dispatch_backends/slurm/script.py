"""The batch script and the ``sbatch`` arguments of a launch (pure; no I/O).

**The script.** ``spec.script`` is kept as the user wrote it, ``#SBATCH`` lines included:
its first line (``#!...``, else ``#!/bin/sh`` is put first) and its leading block of
comments and blank lines (where sbatch reads ``#SBATCH`` directives) come first; dispatch's
prologue follows; then the rest of the script. A script whose interpreter is not a shell
(``#!/usr/bin/env python3``) is run by that interpreter from a here-document
(``exec <interpreter> /dev/fd/3 3<<'EOF'``), after the prologue ran in ``/bin/sh``. A
``spec.command`` is wrapped: ``#!/bin/sh``, the prologue, ``exec <command>``.

**The prologue** (POSIX sh) runs at the start of *every execution*, because a job Slurm
requeues natively reruns the same script (issue 6; seed 004):

* ``spec.env``, exported first, so that dispatch's own variables win;
* ``DISPATCH_JOB``, ``DISPATCH_SUBMISSION`` (N), ``DISPATCH_GENERATION`` (G) and
  ``DISPATCH_CHECKPOINT`` (when the spec has a root), fixed at submission;
* ``DISPATCH_EPOCH`` = ``epoch(G, N, R)`` with R = ``$SLURM_RESTART_COUNT`` (empty in the
  first run, so 0): the digits of ``G*10**6 + N`` followed by R in 6 digits;
* ``DISPATCH_ATTEMPT`` = ``<SLURM_JOB_ID>-r<R>-<token>``: a job id and its restart count
  differ for every execution on a cluster, and the token (random, fixed at submission)
  keeps it unique across clusters and job-id resets.

**The arguments.** ``sbatch --parsable --hold`` (the closed gate), ``--job-name=dj-<job>``,
``--comment=dj:job=<job> sub=<N> att=<a> gen=<G>`` (submission and attempt readable from the
job), requeue (``--no-requeue`` unless ``options["requeue"]`` is ``yes`` or the script has an
``#SBATCH --requeue`` line: dispatch carries out recovery itself unless a ``requeue`` rule
asks Slurm to), ``--exclude`` (the options' nodes plus the nodes earlier executions lost,
when ``exclude_lost_nodes``), ``--chdir``/``--output``/``--open-mode`` defaults from the
settings, ``--export``, the settings' ``extra_args``, then every other option as
``--<name>=<value>`` (underscores become dashes; an empty value is a flag:
``exclusive = ""`` -> ``--exclusive``). dispatch's own arguments come last, so they win over
the same options given earlier.

**The options checked** (:func:`check_option`, at launch and, through
:func:`dispatch_backends.check_options`, at submission): a name must look like an sbatch long
option and not be one dispatch sets itself (:data:`~.settings.OWNED_OPTIONS`); ``requeue``
must be yes or no; ``time`` must be in Slurm's ``--time`` format
(:func:`~dispatch_backends.time_limit.parse_time_limit`). Any other name is passed through
unchecked, so every sbatch option can be given (and one sbatch doesn't know is refused by
sbatch at launch).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from typing import Final

import msgspec

from dispatch_backends.slurm.parse import DispatchTag, format_comment
from dispatch_backends.slurm.settings import OWNED_OPTIONS, SlurmSettings
from dispatch_backends.time_limit import parse_time_limit
from dispatch_core.state import JobSpec
from dispatch_core.steps import Launch

__all__ = [
    "InvalidSpec",
    "Submission",
    "batch_script",
    "check_option",
    "leading_block",
    "prologue",
    "sbatch_args",
    "sbatch_directives",
    "submission",
]

_SHELLS: Final = frozenset({"sh", "bash", "dash", "ksh", "zsh", "ash", "mksh", "busybox"})
_OPTION: Final = re.compile(r"^[a-z][a-z0-9_-]*$")
_TRUE: Final = frozenset({"yes", "true", "1", "on"})
_FALSE: Final = frozenset({"no", "false", "0", "off"})
_SBATCH: Final = re.compile(r"^#SBATCH\s+(.*)$")


class InvalidSpec(ValueError):
    """The spec can't be submitted as it is (the launch is refused with this message)."""


class Submission(msgspec.Struct, frozen=True, kw_only=True):
    """What ``sbatch`` is given: its arguments and the script (on stdin)."""

    args: tuple[str, ...]
    script: str


def _interpreter(shebang: str) -> list[str]:
    return shlex.split(shebang[2:].strip())


def _is_shell(argv: Sequence[str]) -> bool:
    if not argv:
        return True
    program = argv[0].rsplit("/", 1)[-1]
    if program == "env":
        rest = [a for a in argv[1:] if not a.startswith("-")]
        program = rest[0].rsplit("/", 1)[-1] if rest else ""
    return program in _SHELLS


def leading_block(script: str) -> list[tuple[int, str]]:
    """The script's leading comment block, as ``(line number from 1, line)``: after the
    ``#!`` line, every comment and blank line up to the first command. sbatch reads its
    ``#SBATCH`` directives there only (a directive after a command is an ordinary comment),
    and so does everything of dispatch's that reads directives (this backend,
    ``dispatch sbatch``'s ``#DISPATCH`` lines)."""
    lines = script.splitlines()
    first = 1 if lines and lines[0].startswith("#!") else 0
    block: list[tuple[int, str]] = []
    for number, line in enumerate(lines[first:], start=first + 1):
        if line.strip() and not line.lstrip().startswith("#"):
            break
        block.append((number, line))
    return block


def _split_script(script: str) -> tuple[str, list[str], list[str]]:
    """(shebang, header lines, body lines)."""
    lines = script.splitlines()
    shebang = "#!/bin/sh"
    if lines and lines[0].startswith("#!"):
        shebang = lines[0]
    block = leading_block(script)
    end = block[-1][0] if block else (1 if lines and lines[0].startswith("#!") else 0)
    return shebang, [line for _, line in block], lines[end:]


def sbatch_directives(script: str) -> list[str]:
    """The arguments of the script's ``#SBATCH`` lines (as sbatch reads them: the leading
    comment block only)."""
    _, header, _ = _split_script(script)
    out: list[str] = []
    for line in header:
        match = _SBATCH.match(line.strip())
        if match:
            words = match.group(1).split("#", 1)[0]
            out.extend(shlex.split(words))
    return out


def _epoch_prefix(generation: int, submission: int) -> str:
    """The digits of ``epoch(G, N, 0) // 10**6``: the epoch is these followed by R in six
    digits (seed 004: ``G*10**12 + N*10**6 + R``)."""
    return str(generation * 10**6 + submission)


def prologue(launch: Launch, token: str) -> list[str]:
    """The lines that give each execution its identity (see the module docstring)."""
    spec = launch.spec
    lines = ["# --- dispatch: this execution's identity (computed at every start) ---"]
    for key, value in spec.env.items():
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
            raise InvalidSpec(f"env: {key!r} is not a variable name")
        lines.append(f"export {key}={shlex.quote(value)}")
    lines += [
        f"export DISPATCH_JOB={shlex.quote(launch.intent.job_id)}",
        f"export DISPATCH_SUBMISSION={launch.submission}",
        f"export DISPATCH_GENERATION={launch.generation}",
    ]
    if spec.checkpoint is not None:
        lines.append(f"export DISPATCH_CHECKPOINT={shlex.quote(spec.checkpoint)}")
    lines += [
        "unset DISPATCH_RESTART  # the epoch below already has R (dispatch_ckpt would add it)",
        'dispatch_restart="${SLURM_RESTART_COUNT:-0}"',
        "export DISPATCH_EPOCH="
        f'"{_epoch_prefix(launch.generation, launch.submission)}'
        '$(printf %06d "$dispatch_restart")"',
        f'export DISPATCH_ATTEMPT="${{SLURM_JOB_ID}}-r${{dispatch_restart}}-{token}"',
        "unset dispatch_restart",
        "# --- end of dispatch's prologue ---",
    ]
    return lines


def batch_script(launch: Launch, token: str) -> str:
    """The batch script of ``launch`` (see the module docstring).

    Raises:
        InvalidSpec: neither a script nor a command, or both; a bad variable name.
    """
    spec = launch.spec
    if bool(spec.script) == bool(spec.command):
        raise InvalidSpec("a Slurm launch needs exactly one of spec.script and spec.command")
    head = prologue(launch, token)
    if spec.command:
        return "\n".join(["#!/bin/sh", *head, "exec " + shlex.join(spec.command)]) + "\n"
    shebang, header, body = _split_script(spec.script)
    argv = _interpreter(shebang)
    if _is_shell(argv):
        return "\n".join([shebang, *header, *head, *body]) + "\n"
    end = f"DISPATCH_SCRIPT_{token}"
    text = "\n".join([shebang, *header, *body])
    if any(line == end for line in text.splitlines()):
        raise InvalidSpec(f"the script contains the line {end!r}")
    run = "exec " + shlex.join([*argv, "/dev/fd/3"]) + f" \"$@\" 3<<'{end}'"
    return "\n".join(["#!/bin/sh", *header, *head, run, text, end]) + "\n"


def check_option(name: str, value: str) -> None:
    """Refuse an option the Slurm backend won't launch with (see the module docstring).

    Pure; :func:`sbatch_args` checks every option with it, and the API checks a submission's
    with it, so both refuse the same options.

    Args:
        name: the option's name, as in ``JobSpec.options``.
        value: its value.

    Raises:
        InvalidSpec: a name that isn't an sbatch long option's, a name dispatch owns, a
            ``requeue`` other than yes/no, a ``time`` not in Slurm's format.
    """
    if not _OPTION.match(name):
        raise InvalidSpec(
            f"option {name!r} is not an sbatch option name (lower-case letters, digits, "
            "'-' and '_', starting with a letter)"
        )
    if name in OWNED_OPTIONS:
        raise InvalidSpec(
            f"option {name!r} is dispatch's own (or unsupported): remove it from the spec"
        )
    if name == "requeue" and value.lower() not in _TRUE | _FALSE:
        raise InvalidSpec(f"option requeue must be yes or no, got {value!r}")
    if name == "time":
        try:
            parse_time_limit(value)
        except ValueError as err:
            raise InvalidSpec(f"option time: {err}") from None


def _option_args(options: Mapping[str, str]) -> list[str]:
    args = []
    for name, value in options.items():
        check_option(name, value)
        if name in ("requeue", "exclude"):
            continue
        flag = "--" + name.replace("_", "-")
        args.append(flag if value == "" else f"{flag}={value}")
    return args


def _directive_names(directives: Sequence[str]) -> set[str]:
    names = set()
    for word in directives:
        if word.startswith("--"):
            names.add(word[2:].split("=", 1)[0].replace("_", "-"))
        elif word.startswith("-") and len(word) >= 2:
            names.add({"o": "output", "D": "chdir", "x": "exclude"}.get(word[1], word[1]))
    return names


def _directive_excludes(directives: Sequence[str]) -> list[str]:
    """Nodes named by the script's own ``#SBATCH --exclude`` (``-x``) lines: a command-line
    ``--exclude`` replaces them, so they are merged into dispatch's."""
    nodes: list[str] = []
    words = list(directives)
    for i, word in enumerate(words):
        value = None
        if word.startswith("--exclude="):
            value = word.split("=", 1)[1]
        elif word == "--exclude" or word == "-x":
            value = words[i + 1] if i + 1 < len(words) else None
        elif word.startswith("-x"):
            value = word[2:]
        if value:
            nodes.extend(n for n in value.split(",") if n)
    return nodes


def _requeue(spec: JobSpec, directives: set[str]) -> str | None:
    value = spec.options.get("requeue")
    if value is not None:
        if value.lower() in _TRUE:
            return "--requeue"
        if value.lower() in _FALSE:
            return "--no-requeue"
        raise InvalidSpec(f"option requeue must be yes or no, got {value!r}")
    if "requeue" in directives:
        return None
    return "--no-requeue"


def sbatch_args(
    launch: Launch, settings: SlurmSettings, *, exclude: Sequence[str] = ()
) -> tuple[str, ...]:
    """The ``sbatch`` arguments of ``launch`` (see the module docstring).

    Args:
        launch: the launch.
        settings: the cluster's settings.
        exclude: nodes to avoid besides ``options["exclude"]`` (the nodes earlier
            executions lost).

    Raises:
        InvalidSpec: an option :func:`check_option` refuses.
    """
    spec = launch.spec
    words = sbatch_directives(spec.script) if spec.script else []
    directives = _directive_names(words)
    given = {name.replace("_", "-") for name in spec.options} | directives
    args: list[str] = ["--parsable", "--hold"]
    if settings.workdir and "chdir" not in given:
        args.append(f"--chdir={settings.workdir}")
    if settings.output_dir and "output" not in given:
        args.append(f"--output={settings.output_dir.rstrip('/')}/%x-%j.out")
    if settings.open_mode and "open-mode" not in given:
        args.append(f"--open-mode={settings.open_mode}")
    args.append(f"--export={settings.export}")
    args.extend(settings.extra_args)
    args.extend(_option_args(spec.options))
    nodes = _directive_excludes(words)
    nodes += [n for n in spec.options.get("exclude", "").split(",") if n and n not in nodes]
    nodes += [n for n in exclude if n not in nodes]
    if nodes:
        args.append(f"--exclude={','.join(nodes)}")
    requeue = _requeue(spec, directives)
    if requeue is not None:
        args.append(requeue)
    tag = DispatchTag(
        job=launch.intent.job_id,
        submission=launch.submission,
        attempt=launch.attempt,
        generation=launch.generation,
    )
    args += [f"--job-name={launch.name}", f"--comment={format_comment(tag)}"]
    return tuple(args)


def submission(
    launch: Launch, settings: SlurmSettings, token: str, *, exclude: Sequence[str] = ()
) -> Submission:
    """The arguments and script of ``launch``.

    Raises:
        InvalidSpec: see :func:`batch_script` and :func:`sbatch_args`.
    """
    return Submission(
        args=sbatch_args(launch, settings, exclude=exclude),
        script=batch_script(launch, token),
    )
