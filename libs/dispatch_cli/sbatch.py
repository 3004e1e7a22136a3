"""``dispatch sbatch``: a plain Slurm batch script, with ``#DISPATCH`` lines for what dispatch
adds (issue 14, part 3).

The script is an ordinary sbatch script: plain ``sbatch script.sbatch`` runs it (its
``#DISPATCH`` lines are comments there). ``dispatch sbatch [--cluster C] script.sbatch
[args...]`` submits it as a dispatch job instead, its ``#SBATCH`` lines kept (the Slurm
backend hands them to sbatch), with the recovery rules and settings of its ``#DISPATCH``
lines::

    #!/bin/sh
    #SBATCH --job-name=digits
    #SBATCH --partition=lowcancel --time=1
    #DISPATCH resubmit on=preempted,node-lost budget=3
    #DISPATCH hold on=non-zero-exit
    #DISPATCH checkpoint=/ckpt/{job}
    exec python train.py "$@"

**Where directives are read**: as sbatch reads ``#SBATCH`` lines, only in the leading comment
block (after the ``#!`` line, up to the first command;
:func:`dispatch_backends.slurm.script.leading_block`). sbatch ignores a directive after the
first command; a ``#DISPATCH`` line there is refused, with its line number, since it would
look in force and not be. Like sbatch, the first line must be ``#!``.

**The lines** (words split as the shell does, ``# ...`` after them a comment):

* ``#DISPATCH <action> on=<cause>[,<cause>...] [budget=N] [for=DURATION] [enforcer=WHO]
  [max-without-progress=N] [clusters=<cluster>[,<cluster>...]] [wait=DURATION]``: one
  recovery rule (:class:`~dispatch_core.RecoveryRule`), in the order written; ``clusters``
  (failover, issue 14 part 2) only for resubmit; ``wait`` (``15m``: ``wait_s``, how long a
  no-capacity wait is tolerated before dispatch stops the object and applies the rule,
  default 10 minutes) only on a rule whose ``on`` has ``no-capacity``. ``action`` is
  ``resubmit``, ``hold``, ``escalate``, ``restart`` or ``requeue``; ``budget`` (default 3)
  and ``max-without-progress`` only for resubmit, restart and requeue; ``for`` (``12h``:
  when the hold is overdue) only for hold; ``enforcer`` is ``supervisor`` (default) or ``backend``.
* ``#DISPATCH checkpoint=<root>``: ``spec.checkpoint`` (``DISPATCH_CHECKPOINT``; ``{job}``
  becomes the job's id, like ``%j``).
* ``#DISPATCH cluster=<name>``: the cluster, when ``--cluster`` is not given.
* ``#DISPATCH free-if-progress``: every budgeted rule's ``free_if_progress`` (issue 14 part
  1: a recovery after an execution that advanced the published step costs no budget).
* ``#DISPATCH max-without-progress=N``: every budgeted rule's ``max_without_progress`` that
  its own line didn't set (issue 14 part 1: after N executions in a row without advancing
  the published step, the job is held with escalation ``no-progress:<N>``).

Anything else on a ``#DISPATCH`` line (an unknown word, a key twice, a cause no rule may
cover, a budget that is not a number) is refused with the file's name and line number.

**The job**: the spec is ``{cluster, script, checkpoint}`` with ``options.chdir`` the
directory ``dispatch sbatch`` runs in (sbatch's default); its name is the script's
``#SBATCH --job-name``/``-J``, else the file's name without its suffix (sbatch's default job
name is the file's name). ``args`` are the script's arguments, as sbatch passes them: a
``set -- ARGS`` line is put after the leading block (for a shell script; another
interpreter's script can't take arguments this way and is refused).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

import msgspec

from dispatch_backends.slurm.script import leading_block
from dispatch_cli.errors import UsageError
from dispatch_cli.jobfile import parse_causes, parse_duration
from dispatch_cli.render import duration_text
from dispatch_core import (
    Action,
    CauseKind,
    Enforcer,
    InvalidPolicy,
    Plan,
    RecoveryPolicy,
    RecoveryRule,
)
from dispatch_core.policy import validate as validate_policy

__all__ = [
    "FREE_IF_PROGRESS",
    "MAX_WITHOUT_PROGRESS",
    "DispatchDirectives",
    "ScriptError",
    "build_sbatch_submission",
    "parse_directives",
    "plan_summary",
]

FREE_IF_PROGRESS: Final = "free_if_progress"
"""The :class:`~dispatch_core.RecoveryRule` setting ``#DISPATCH free-if-progress`` sets."""

MAX_WITHOUT_PROGRESS: Final = "max_without_progress"
"""The :class:`~dispatch_core.RecoveryRule` setting ``max-without-progress=N`` sets."""

_BUDGETED: Final = frozenset({Action.RESUBMIT, Action.RESTART, Action.REQUEUE})
_DEFAULT_BUDGET: Final = 3
_SETTINGS: Final = ("checkpoint", "cluster")
_DIRECTIVE: Final = re.compile(r"^#DISPATCH(?:\s|$)")
_NAME_RE: Final = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,52}[a-z0-9])?$")
_SBATCH_NAME: Final = re.compile(r"^#SBATCH\s+(?:--job-name[=\s]\s*|-J\s*)(\S+)")
_SHELLS: Final = frozenset({"sh", "bash", "dash", "ksh", "zsh", "ash", "mksh"})


class ScriptError(UsageError):
    """A script ``dispatch sbatch`` can't submit; the message names the file and line."""


class DispatchDirectives(msgspec.Struct, frozen=True, kw_only=True):
    """What a script's ``#DISPATCH`` and ``#SBATCH`` lines say.

    Attributes:
        rules: the recovery rules, as ``policy.rules`` holds them (``POST /v1/jobs``).
        checkpoint: ``#DISPATCH checkpoint=``, or ``None``.
        cluster: ``#DISPATCH cluster=``, or ``None``.
        job_name: ``#SBATCH --job-name``/``-J`` (the last one, as sbatch takes it), or
            ``None``.
    """

    rules: tuple[dict[str, Any], ...] = ()
    checkpoint: str | None = None
    cluster: str | None = None
    job_name: str | None = None


def _fail(where: str, line: str, why: str) -> ScriptError:
    return ScriptError(f"{where}: `{line.strip()}`: {why}")


def _words(where: str, line: str) -> list[str]:
    try:
        return shlex.split(line.strip()[len("#DISPATCH") :], comments=True)
    except ValueError as err:
        raise _fail(where, line, f"can't be split into words ({err})") from err


def _rule(
    where: str, line: str, action: Action, pairs: Sequence[tuple[str, str]]
) -> dict[str, Any]:
    rule: dict[str, Any] = {"action": action.value}
    for key, value in pairs:
        if key == "on":
            try:
                rule["on"] = [c.value for c in parse_causes(value, option="on")]
            except UsageError as err:
                raise _fail(where, line, err.message) from err
        elif key == "budget":
            if action not in _BUDGETED:
                raise _fail(where, line, f"a {action.value} rule has no budget")
            if not value.isdigit():
                raise _fail(where, line, f"budget={value!r} is not a whole number >= 0")
            rule["budget"] = int(value)
        elif key == "for":
            if action is not Action.HOLD:
                raise _fail(where, line, "for= (when a hold is overdue) is only for hold rules")
            try:
                rule["hold_for_s"] = parse_duration(value, option="for")
            except UsageError as err:
                raise _fail(where, line, err.message) from err
        elif key == "max-without-progress":
            if action not in _BUDGETED:
                raise _fail(where, line, f"a {action.value} rule has no max-without-progress")
            rule[MAX_WITHOUT_PROGRESS] = _count(where, line, value)
        elif key == "clusters":
            if action is not Action.RESUBMIT:
                raise _fail(where, line, "clusters= (failover) is only for resubmit rules")
            names = [c.strip() for c in value.split(",")]
            if not all(names):
                raise _fail(where, line, f"clusters={value!r}: name clusters, comma-separated")
            _check_clusters(where, line, names)
            rule["clusters"] = names
        elif key == "wait":
            try:
                rule["wait_s"] = parse_duration(value, option="wait")
            except UsageError as err:
                raise _fail(where, line, err.message) from err
        elif key == "enforcer":
            if value not in {e.value for e in Enforcer}:
                raise _fail(where, line, f"enforcer={value!r}: say supervisor or backend")
            rule["enforcer"] = value
        else:
            raise _fail(
                where,
                line,
                f"unknown key {key!r} for a rule (on=, budget=, for=, enforcer=, "
                "max-without-progress=, clusters=, wait=)",
            )
    if "on" not in rule:
        raise _fail(where, line, "a rule needs on=CAUSE[,CAUSE...]")
    if "wait_s" in rule and "no-capacity" not in rule["on"]:
        raise _fail(
            where, line, "wait= (how long a no-capacity wait is tolerated) needs on=no-capacity"
        )
    if action in _BUDGETED and "budget" not in rule:
        rule["budget"] = _DEFAULT_BUDGET
    return rule


def _budgeted(rules: list[dict[str, Any]], where: str, option: str) -> list[dict[str, Any]]:
    """The resubmit, restart and requeue rules that ``option`` (given at ``where``) applies
    to; a script with none of them is refused."""
    budgeted = [r for r in rules if Action(r["action"]) in _BUDGETED]
    if not budgeted:
        raise ScriptError(
            f"{where}: {option} applies to resubmit, restart and requeue rules, and the "
            "script has none"
        )
    return budgeted


def _check_clusters(where: str, line: str, names: list[str]) -> None:
    """Refuse, at its line, a failover list the core's ``validate`` refuses (``LAB2``, a
    cluster named twice): sent as is, the API refused it naming ``policy.rules[i]``, not
    the line to fix. Whether each cluster exists is the API's (the clusters file). The
    list is checked on a rule of its own, covering a cause any resubmit rule may cover, so
    only the list is judged here."""
    alone = RecoveryRule(on=(CauseKind.PREEMPTED,), action=Action.RESUBMIT, clusters=tuple(names))
    try:
        validate_policy(RecoveryPolicy(rules=(alone,)))
    except InvalidPolicy as err:
        raise _fail(where, line, err.reason) from None


def _count(where: str, line: str, value: str) -> int:
    """``max-without-progress=N``: a whole number >= 1."""
    if not (value.isascii() and value.isdigit()) or int(value) < 1:
        raise _fail(where, line, f"max-without-progress={value!r} is not a whole number >= 1")
    return int(value)


def _known() -> str:
    """The directives a ``#DISPATCH`` line may start with, for an unknown one's message."""
    return ", ".join(
        [a.value for a in Action]
        + [f"{k}=" for k in _SETTINGS]
        + ["free-if-progress", "max-without-progress="]
    )


def _pairs(where: str, line: str, words: Sequence[str]) -> list[tuple[str, str]]:
    pairs: list[tuple[str, str]] = []
    seen: set[str] = set()
    for word in words:
        key, eq, value = word.partition("=")
        if not eq and pairs:
            # ``for=12 hours``: the line was split at the space, so the value's rest stands
            # alone; say so rather than that the stray word isn't a setting.
            last, last_value = pairs[-1]
            spaced = f"{last_value} {word}"
            raise _fail(
                where,
                line,
                f"{last}={spaced}: a value with spaces must be quoted "
                f'({last}="{spaced}") or have none',
            )
        if not eq or not key:
            raise _fail(where, line, f"{word!r} is not KEY=VALUE")
        if key in seen:
            raise _fail(where, line, f"{key}= is given twice")
        seen.add(key)
        pairs.append((key, value))
    return pairs


def parse_directives(text: str, *, source: str = "script") -> DispatchDirectives:
    """Read a batch script's ``#DISPATCH`` lines and its job name (see the module docstring).

    Args:
        text: the script.
        source: its name, for messages (``digits.sbatch:7: ...``).

    Raises:
        ScriptError: no ``#!`` first line, or a malformed or misplaced ``#DISPATCH`` line
            (named by its line number).
    """
    if not text.startswith("#!"):
        raise ScriptError(
            f"{source}:1: a batch script starts with #! and its interpreter, as sbatch "
            "requires (e.g. #!/bin/sh)"
        )
    block = leading_block(text)
    in_block = {number for number, _ in block}
    rules: list[dict[str, Any]] = []
    settings: dict[str, str] = {}
    free_if_progress: str | None = None
    without_progress: tuple[str, int] | None = None
    job_name: str | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        where = f"{source}:{number}"
        stripped = line.strip()
        if number in in_block:
            name = _SBATCH_NAME.match(stripped)
            if name is not None:
                job_name = name.group(1)
        if not _DIRECTIVE.match(stripped):
            continue
        if number not in in_block:
            raise _fail(
                where,
                line,
                "after the script's first command: sbatch reads directives only before it; "
                "move the line up",
            )
        words = _words(where, line)
        if not words:
            raise _fail(where, line, "empty directive (say a rule, checkpoint=, ...)")
        head = words[0]
        if head == "free-if-progress":
            if len(words) > 1:
                raise _fail(where, line, "free-if-progress takes no value")
            free_if_progress = where
            continue
        try:
            action = Action(head)
        except ValueError:
            action = None
        if action is not None:
            rules.append(_rule(where, line, action, _pairs(where, line, words[1:])))
            continue
        if "=" not in head and head not in (*_SETTINGS, "max-without-progress"):
            raise _fail(where, line, f"unknown directive {head!r} (known: {_known()})")
        for key, value in _pairs(where, line, words):
            if key == "max-without-progress":
                if without_progress is not None:
                    raise _fail(where, line, f"{key}= was already given")
                without_progress = (where, _count(where, line, value))
                continue
            if key not in _SETTINGS:
                raise _fail(where, line, f"unknown directive {key!r} (known: {_known()})")
            if key in settings:
                raise _fail(where, line, f"{key}= was already given")
            if not value:
                raise _fail(where, line, f"{key}= needs a value")
            settings[key] = value
    if free_if_progress is not None:
        for rule in _budgeted(rules, free_if_progress, "free-if-progress"):
            rule[FREE_IF_PROGRESS] = True
    if without_progress is not None:
        where, limit = without_progress
        for rule in _budgeted(rules, where, "max-without-progress"):
            rule.setdefault(MAX_WITHOUT_PROGRESS, limit)
    return DispatchDirectives(
        rules=tuple(rules),
        checkpoint=settings.get("checkpoint"),
        cluster=settings.get("cluster"),
        job_name=job_name,
    )


def _job_name(directives: DispatchDirectives, path: Path) -> str | None:
    raw = directives.job_name or path.name.split(".", 1)[0]
    name = re.sub(r"[^a-z0-9-]+", "-", raw.lower()).strip("-")[:54].strip("-")
    return name if _NAME_RE.match(name) else None


def _with_args(text: str, args: Sequence[str], source: str) -> str:
    """The script with ``set -- ARGS`` after its leading block (see the module docstring)."""
    if not args:
        return text
    interpreter = shlex.split(text.splitlines()[0][2:].strip()) or ["sh"]
    program = interpreter[0].rsplit("/", 1)[-1]
    if program == "env":
        rest = [a for a in interpreter[1:] if not a.startswith("-")]
        program = rest[0].rsplit("/", 1)[-1] if rest else ""
    if program not in _SHELLS:
        raise ScriptError(
            f"{source}:1: arguments can be given to a shell script only (this one runs "
            f"{program!r}): put them in the script"
        )
    lines = text.splitlines(keepends=True)
    block = leading_block(text)
    end = block[-1][0] if block else 1
    set_line = "set -- " + shlex.join(args) + "  # dispatch sbatch: the script's arguments\n"
    if lines[end - 1] and not lines[end - 1].endswith("\n"):
        lines[end - 1] += "\n"
    return "".join([*lines[:end], set_line, *lines[end:]])


def build_sbatch_submission(
    path: Path,
    args: Sequence[str],
    *,
    cluster: str | None,
    chdir: str,
    reason: str | None = None,
    read: Callable[[Path], str] = Path.read_text,
) -> dict[str, Any]:
    """The body of ``POST /v1/jobs`` for ``dispatch sbatch path args...``.

    Args:
        path: the batch script.
        args: its arguments.
        cluster: ``--cluster`` (wins over ``#DISPATCH cluster=``).
        chdir: the job's working directory.
        reason: ``--reason``.
        read: how the file is read.

    Raises:
        UsageError: the file can't be read; no cluster named.
        ScriptError: see :func:`parse_directives`; arguments to a non-shell script.
    """
    try:
        text = read(path)
    except (OSError, UnicodeDecodeError) as err:
        why = err.strerror if isinstance(err, OSError) else str(err)
        raise UsageError(f"cannot read the batch script {str(path)!r}: {why or err}") from err
    source = str(path)
    directives = parse_directives(text, source=source)
    where = cluster or directives.cluster
    if not where:
        raise UsageError(
            f"{path}: say which cluster runs it: --cluster NAME, or a `#DISPATCH cluster=NAME` line"
        )
    spec: dict[str, Any] = {
        "cluster": where,
        "script": _with_args(text, args, source),
        "options": {"chdir": chdir},
    }
    if directives.checkpoint is not None:
        spec["checkpoint"] = directives.checkpoint
    body: dict[str, Any] = {"spec": spec, "policy": {"rules": list(directives.rules)}}
    name = _job_name(directives, path)
    if name:
        body["name"] = name
    if reason:
        body["reason"] = reason
    return body


def plan_summary(plan: Plan) -> str:
    """The plan's rules on one line, for ``Submitted dispatch job <id> (plan: ...)``:
    ``resubmit on preempted,node-lost budget 3 fail over slurm -> local; hold on
    non-zero-exit``, a substitution and an unenforced rule marked (``dispatch submit``
    prints the same in full)."""
    parts = []
    for rule in plan.rules:
        text = f"{rule.action.value} on {','.join(k.value for k in rule.on)}"
        if rule.action in _BUDGETED:
            text += f" budget {rule.budget}"
        if rule.clusters:
            text += f" fail over {' -> '.join(rule.clusters)}"
        if rule.wait_s is not None:
            text += f" after {duration_text(rule.wait_s)} without capacity"
        if rule.substituted_for is not None:
            text += f" [instead of {rule.substituted_for.value}]"
        if rule.unenforced:
            text += " [NOT ENFORCED]"
        parts.append(text)
    return "; ".join(parts) or "no rules"
