"""What ``dispatch submit FILE`` sends: a dispatch job file, or a plain sbatch script.

**A job file** is TOML (``*.toml``) or JSON (any other name ending in ``.json``) holding the
body of ``POST /v1/jobs``: ``spec`` (what to run and where), ``policy`` (the recovery rules)
and optionally ``name`` (the prefix of the job id the API makes), ``job_id`` and ``reason``.
``examples/local-train.toml`` is a commented example::

    name = "digits"

    [spec]
    cluster = "local"
    command = ["python", "examples/local/train.py", "--epochs", "20"]
    checkpoint = "/tmp/dispatch-examples/digits/{job}"   # DISPATCH_CHECKPOINT; {job}: job id
    options = { time = "30:00" }                  # Slurm's time format, on every backend
    env = { PYTHONUNBUFFERED = "1" }

    [[policy.rules]]
    on = ["preempted", "node-lost"]
    action = "resubmit"
    budget = 3

    [[policy.rules]]
    on = ["non-zero-exit"]
    action = "hold"

The API checks it and names the field at fault (``spec.cluster``, ``policy.rules[1].on``).
Each ``{job}`` in ``spec.checkpoint`` is replaced by the job's id when the job is created
(like Slurm's ``%j``; the file is sent as written), so every submission of one file gets a
checkpoint root of its own; ``dispatch supersede`` continues a finished job in the old
job's root.

**A batch script** (a file whose first line is ``#!`` or that has ``#SBATCH`` lines): the
spec is ``{"cluster": --cluster, "script": <the file>}`` (the Slurm backend keeps its
``#SBATCH`` lines; the local backend runs it as a script), the job name comes from
``#SBATCH --job-name``/``-J`` when it makes a valid id, and the policy from ``--policy FILE``
or the rule flags (``--resubmit-on preempted,node-lost --budget 3``).

**Checked before sending**: a key the API doesn't know (``comand =``) is named, with the
closest known one, rather than ignored; a value of ``spec.options`` or ``spec.env`` that is
not a string (``gpus = 2``) is named by its key (``spec.options.gpus``), so the message says
which line to fix. The keys known are the fields of the core's ``JobSpec`` and
``RecoveryRule``, read from them.

**Working directory**: unless the spec sets ``options.chdir``, the job runs in the directory
``dispatch submit`` was run from, as ``sbatch`` does (``--chdir`` changes it).
"""

from __future__ import annotations

import difflib
import json
import re
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import msgspec

from dispatch_cli.errors import UsageError
from dispatch_core import COVERABLE_CAUSES, CauseKind, JobSpec, RecoveryRule

__all__ = [
    "PolicyFlags",
    "build_submission",
    "check_job_file",
    "is_batch_script",
    "parse_causes",
    "parse_duration",
    "read_policy_file",
]

_NAME_RE: Final = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,52}[a-z0-9])?$")
_SBATCH_NAME: Final = re.compile(r"^#SBATCH\s+(?:--job-name[=\s]\s*|-J\s*)(\S+)", re.MULTILINE)
_SCRIPT_SUFFIXES: Final = frozenset({".sh", ".sbatch", ".slurm", ".bash"})
_TOP_KEYS: Final = ("spec", "policy", "name", "job_id", "reason")
"""The keys of ``POST /v1/jobs``'s body (``services/api/schemas.py``, ``SubmitRequest``)."""
_SPEC_KEYS: Final = tuple(f.encode_name for f in msgspec.structs.fields(JobSpec))
_RULE_KEYS: Final = tuple(f.encode_name for f in msgspec.structs.fields(RecoveryRule))
_STRING_MAPS: Final = ("options", "env")
_DURATION: Final = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNITS: Final = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
"""Spec keys whose values are strings by name (``dict[str, str]`` in ``JobSpec``)."""


class PolicyFlags:
    """The rule flags of ``submit``: each becomes one rule, in this order."""

    def __init__(
        self,
        *,
        resubmit_on: Sequence[CauseKind] = (),
        budget: int | None = None,
        hold_on: Sequence[CauseKind] = (),
        hold_for_s: float | None = None,
        escalate_on: Sequence[CauseKind] = (),
    ) -> None:
        self.resubmit_on = tuple(resubmit_on)
        self.budget = budget
        self.hold_on = tuple(hold_on)
        self.hold_for_s = hold_for_s
        self.escalate_on = tuple(escalate_on)

    @property
    def given(self) -> bool:
        """Whether any rule flag was given."""
        return bool(self.resubmit_on or self.hold_on or self.escalate_on)

    def rules(self) -> list[dict[str, Any]]:
        """The rules, as ``policy.rules`` holds them.

        Raises:
            UsageError: ``--budget`` without ``--resubmit-on``, or ``--hold-for`` without
                ``--hold-on``.
        """
        if self.budget is not None and not self.resubmit_on:
            raise UsageError("--budget is the budget of --resubmit-on: give both")
        if self.hold_for_s is not None and not self.hold_on:
            raise UsageError("--hold-for is the deadline of --hold-on's hold: give both")
        rules: list[dict[str, Any]] = []
        if self.resubmit_on:
            budget = 3 if self.budget is None else self.budget
            rules.append({"on": list(self.resubmit_on), "action": "resubmit", "budget": budget})
        if self.hold_on:
            rule: dict[str, Any] = {"on": list(self.hold_on), "action": "hold"}
            if self.hold_for_s is not None:
                rule["hold_for_s"] = self.hold_for_s
            rules.append(rule)
        if self.escalate_on:
            rules.append({"on": list(self.escalate_on), "action": "escalate"})
        return rules


def parse_causes(text: str, *, option: str) -> tuple[CauseKind, ...]:
    """Parse a comma-separated list of causes (``preempted,node-lost``).

    Raises:
        UsageError: a name that isn't a cause a rule may cover, listing the ones that are.
    """
    out: list[CauseKind] = []
    for raw in text.split(","):
        name = raw.strip()
        if not name:
            continue
        try:
            kind = CauseKind(name)
        except ValueError:
            kind = None
        if kind is None or kind not in COVERABLE_CAUSES:
            known = ", ".join(sorted(k.value for k in COVERABLE_CAUSES))
            raise UsageError(f"{option}: {name!r} is not a cause a rule may cover ({known})")
        out.append(kind)
    if not out:
        raise UsageError(f"{option}: name at least one cause")
    return tuple(out)


def parse_duration(text: str, *, option: str) -> float:
    """``90``, ``90s``, ``30m``, ``2h``, ``1d`` -> seconds.

    Raises:
        UsageError: it doesn't parse or isn't positive.
    """
    match = _DURATION.match(text)
    if match is None or float(match.group(1)) <= 0:
        raise UsageError(f"{option}: {text!r} is not a duration like 90s, 30m, 2h or 1d")
    return float(match.group(1)) * _UNITS[match.group(2)]


def _load_structured(path: Path, what: str) -> object:
    try:
        data = path.read_bytes()
    except OSError as err:
        raise UsageError(f"cannot read the {what} {str(path)!r}: {err.strerror or err}") from err
    try:
        if path.suffix.lower() == ".toml":
            return tomllib.loads(data.decode())
        return json.loads(data)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, ValueError) as err:
        kind = "TOML" if path.suffix.lower() == ".toml" else "JSON"
        raise UsageError(f"{path}: not valid {kind}: {err}") from err


def read_policy_file(path: Path) -> dict[str, Any]:
    """Read a policy file: TOML or JSON with a ``rules`` list (``[[rules]]``).

    Raises:
        UsageError: unreadable, not TOML/JSON, not a table with ``rules``, or an unknown key
            (named).
    """
    raw = _load_structured(path, "policy file")
    if not isinstance(raw, dict) or not isinstance(raw.get("rules"), list):
        raise UsageError(f"{path}: a policy file holds a list of rules ([[rules]] in TOML)")
    _check_keys(path, "", raw, ("rules",))
    _check_rules(path, "", raw["rules"])
    return raw


def _unknown_key(path: Path, where: str, key: str, known: Sequence[str]) -> UsageError:
    close = difflib.get_close_matches(key, known, n=1)
    hint = f"did you mean `{close[0]}`? " if close else ""
    place = f" in {where}" if where else ""
    return UsageError(
        f"{path}: unknown key `{key}`{place} ({hint}known: {', '.join(f'`{k}`' for k in known)})"
    )


def _check_keys(path: Path, where: str, table: Mapping[str, Any], known: Sequence[str]) -> None:
    for key in table:
        if key not in known:
            raise _unknown_key(path, where, str(key), known)


def _check_rules(path: Path, where: str, rules: object) -> None:
    if not isinstance(rules, list):
        return  # the API names a wrong type; only unknown keys are the CLI's to catch
    for i, rule in enumerate(rules):
        if isinstance(rule, Mapping):
            _check_keys(path, f"{where}rules[{i}]", rule, _RULE_KEYS)
            if rule.get("clusters") == []:
                # the core reads [] as no list at all: the job would never fail over
                raise UsageError(
                    f"{path}: {where}rules[{i}].clusters is empty: list the clusters to fail "
                    "over to, in order, or drop the key for a rule that stays on its cluster"
                )


def _type_name(value: object) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", list: "a list",
            dict: "a table"}.get(type(value), type(value).__name__)  # fmt: skip


def check_job_file(path: Path, body: Mapping[str, Any]) -> None:
    """Check a job file's keys and string maps before it is sent (see the module docstring).

    The API checks everything else and names the field at fault; it can't name a key it
    ignores or the key of a map value of the wrong type, so those are checked here.

    Raises:
        UsageError: an unknown key (named, with the closest known one), or a value of
            ``spec.options``/``spec.env`` that is not a string (named by its key).
    """
    _check_keys(path, "", body, _TOP_KEYS)
    spec = body.get("spec")
    if isinstance(spec, Mapping):
        _check_keys(path, "[spec]", spec, _SPEC_KEYS)
        for name in _STRING_MAPS:
            table = spec.get(name)
            if not isinstance(table, Mapping):
                continue
            for key, value in table.items():
                if not isinstance(value, str):
                    shown = json.dumps(value) if not isinstance(value, dict) else "{...}"
                    quoted = json.dumps(shown if isinstance(value, bool | int | float) else "...")
                    raise UsageError(
                        f"{path}: spec.{name}.{key}: expected a string, got "
                        f"{_type_name(value)} ({shown}); quote it: {key} = {quoted}"
                    )
    policy = body.get("policy")
    if isinstance(policy, Mapping):
        _check_keys(path, "[policy]", policy, ("rules",))
        _check_rules(path, "policy.", policy.get("rules"))


def is_batch_script(path: Path, text: str) -> bool:
    """Whether ``path`` is a batch script rather than a job file (see the module docstring)."""
    if path.suffix.lower() in (".toml", ".json"):
        return False
    return (
        path.suffix.lower() in _SCRIPT_SUFFIXES
        or text.startswith("#!")
        or bool(re.search(r"^#SBATCH", text, re.MULTILINE))
    )


def _script_name(text: str) -> str | None:
    match = _SBATCH_NAME.search(text)
    if match is None:
        return None
    name = re.sub(r"[^a-z0-9-]+", "-", match.group(1).lower()).strip("-")[:54].strip("-")
    return name if _NAME_RE.match(name) else None


def build_submission(
    path: Path,
    *,
    cluster: str | None,
    name: str | None,
    job_id: str | None,
    reason: str | None,
    chdir: str,
    policy_file: Path | None,
    flags: PolicyFlags,
) -> dict[str, Any]:
    """Return the body of ``POST /v1/jobs`` for ``dispatch submit path``.

    Args:
        path: the job file or batch script.
        cluster: ``--cluster`` (required for a script; overrides a job file's).
        name: ``--name``: the prefix of the job id the API makes.
        job_id: ``--job-id``: the job's id.
        reason: ``--reason``.
        chdir: the working directory when the spec sets none.
        policy_file: ``--policy``.
        flags: the rule flags.

    Raises:
        UsageError: the file can't be read or parsed; a script without ``--cluster``; a
            policy given twice (in the file and by ``--policy`` or flags).
    """
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        why = err.strerror if isinstance(err, OSError) else str(err)
        raise UsageError(f"cannot read the job file {str(path)!r}: {why or err}") from err
    body: dict[str, Any]
    if is_batch_script(path, text):
        if not cluster:
            raise UsageError(
                f"{path} is a batch script: say which cluster runs it with --cluster NAME"
            )
        body = {"spec": {"cluster": cluster, "script": text}}
        script_name = _script_name(text)
        if script_name and not name and not job_id:
            body["name"] = script_name
    else:
        raw = _load_structured(path, "job file")
        if not isinstance(raw, dict):
            raise UsageError(f"{path}: a job file is a table (TOML) or an object (JSON)")
        body = dict(raw)
        check_job_file(path, body)
        spec = body.get("spec")
        if not isinstance(spec, dict):
            raise UsageError(f"{path}: a job file needs a [spec] table (cluster, command, ...)")
        body["spec"] = dict(spec)
        if cluster:
            body["spec"]["cluster"] = cluster
    _apply_chdir(body["spec"], chdir)
    from_flags = flags.rules()
    if policy_file is not None and from_flags:
        raise UsageError("give the rules either with --policy FILE or with rule flags, not both")
    if (policy_file is not None or from_flags) and "policy" in body:
        raise UsageError(
            f"{path} has its own [policy]: drop it, or drop --policy and the rule flags"
        )
    if policy_file is not None:
        body["policy"] = read_policy_file(policy_file)
    elif from_flags:
        body["policy"] = {"rules": from_flags}
    for key, value in (("name", name), ("job_id", job_id), ("reason", reason)):
        if value:
            body[key] = value
    return body


def _apply_chdir(spec: dict[str, Any], chdir: str) -> None:
    options = spec.get("options")
    if options is None:
        spec["options"] = {"chdir": chdir}
    elif isinstance(options, Mapping) and "chdir" not in options:
        spec["options"] = {**options, "chdir": chdir}
