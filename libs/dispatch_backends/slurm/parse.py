"""Pure parsers of what Slurm's commands print (no I/O): text in, plain records out.

Every parser here is tested on the real outputs recorded in ``tests/data/slurm/`` (Slurm
22.05.8) and on constructed files for what the test cluster can't produce
(``tests/data/slurm-constructed/``: other Slurm versions' JSON, ``BOOT_FAIL``, a cancel by
another uid, arrays). The traps they handle are the ones recorded in
``deploy/slurm/README.md`` ("Findings") and ``shared/slurm-lab/README.md``:

* ``squeue --json``'s ``exit_code`` is a raw wait status (``256`` = exit 1, ``15`` =
  SIGTERM, ``36608`` = exit 143); from openapi v0.0.40 (23.11) it is an object with
  ``status``/``return_code``/``signal``, and numbers may be ``{"set", "infinite",
  "number"}`` structs; ``job_state`` becomes a list (base state, then flags). All are read.
* ``squeue -O`` prints ``(null)`` for an empty comment, ``N/A`` for no array task, times in
  local time without a zone (``SLURM_TIME_FORMAT=standard``).
* ``sacct -P`` prints ``CANCELLED by 0`` as one State; its ``ExitCode`` is ``exit:signal``
  and may be empty (a node-failed batch step); ids are ``123``, ``123_4``, ``123.batch``,
  ``123_4.batch``, ``123+0`` (hetjob), ``123_[1-3]`` (a pending array).
* ``scontrol -o show job`` prints values unquoted, so ``Comment=a b`` can't be split on
  spaces: values run to the next known key.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final

import msgspec

__all__ = [
    "ACCT_FIELDS",
    "JOBCOMP_FIELDS",
    "QUEUE_FIELDS",
    "SINFO_FIELDS",
    "AcctRow",
    "DispatchTag",
    "ExitStatus",
    "JobId",
    "NodeState",
    "ParseError",
    "QueueJob",
    "comment_from_submit_line",
    "expand_hostlist",
    "format_comment",
    "parse_comment",
    "parse_exit",
    "parse_job_id",
    "parse_memory",
    "parse_sacct",
    "parse_scontrol",
    "parse_sinfo",
    "parse_slurm_time",
    "parse_squeue_json",
    "parse_squeue_text",
    "runs",
    "steps_of",
    "tres_value",
    "wait_status",
]


class ParseError(ValueError):
    """Slurm printed something the parser can't read (names the line or field)."""


# -- small values ----------------------------------------------------------------------------


class ExitStatus(msgspec.Struct, frozen=True):
    """An exit status as Slurm prints it, ``code:signal`` (``1:0``, ``0:15``, ``143:0``)."""

    code: int
    signal: int

    @property
    def words(self) -> str:
        """Slurm's own spelling, ``code:signal``."""
        return f"{self.code}:{self.signal}"


def parse_exit(text: str) -> ExitStatus | None:
    """Parse sacct's/scontrol's ``code:signal``; ``None`` for an empty field.

    Raises:
        ParseError: not ``<int>:<int>``.
    """
    text = text.strip()
    if not text:
        return None
    code, sep, signal = text.partition(":")
    if not sep or not code.isdigit() or not signal.isdigit():
        raise ParseError(f"exit code {text!r} is not <code>:<signal>")
    return ExitStatus(int(code), int(signal))


def wait_status(raw: int) -> ExitStatus:
    """Decode a raw wait status (``squeue --json`` 22.05, ``-O exit_code``) the way
    scontrol prints it: ``WEXITSTATUS:WTERMSIG`` (256 -> ``1:0``, 15 -> ``0:15``, 253 ->
    ``0:125``, 36608 -> ``143:0``)."""
    return ExitStatus((raw >> 8) & 0xFF, raw & 0x7F)


_NULL_TIMES: Final = frozenset({"", "N/A", "NONE", "None", "Unknown", "(null)", "0"})


def parse_slurm_time(text: str) -> datetime | None:
    """Parse a Slurm time (``2026-11-30T09:38:10``, local time without a zone) as an aware
    datetime; ``None`` for ``N/A``, ``Unknown``, ``NONE`` and the like.

    Raises:
        ParseError: not ISO 8601 (set ``SLURM_TIME_FORMAT=standard``).
    """
    text = text.strip()
    if text in _NULL_TIMES:
        return None
    try:
        value = datetime.fromisoformat(text)
    except ValueError as err:
        raise ParseError(f"time {text!r} is not ISO 8601") from err
    return value.astimezone() if value.tzinfo is None else value


def _epoch_time(value: int | None) -> datetime | None:
    if value is None or value <= 0:
        return None
    return datetime.fromtimestamp(value, UTC)


_RANGE: Final = re.compile(r"^(\d+)(?:-(\d+))?$")


def expand_hostlist(text: str) -> tuple[str, ...]:
    """Expand a Slurm host list: ``node[1-3],gpu[01-02,05]`` -> ``node1``, ``node2``, ...
    (zero padding kept); empty, ``(null)``, ``None assigned`` -> ``()``.

    Raises:
        ParseError: an unbalanced bracket or a bad range.
    """
    text = text.strip()
    if text in ("", "(null)", "None assigned", "N/A"):
        return ()
    out: list[str] = []
    for item in _split_top(text):
        open_at = item.find("[")
        if open_at < 0:
            out.append(item)
            continue
        close_at = item.find("]", open_at)
        if close_at < 0:
            raise ParseError(f"host list {text!r}: unbalanced '['")
        prefix, body, rest = item[:open_at], item[open_at + 1 : close_at], item[close_at + 1 :]
        tails = expand_hostlist(rest) if "[" in rest else (rest,)
        for part in body.split(","):
            match = _RANGE.match(part)
            if match is None:
                raise ParseError(f"host list {text!r}: bad range {part!r}")
            low, high = match.group(1), match.group(2) or match.group(1)
            width = len(low)
            for n in range(int(low), int(high) + 1):
                for tail in tails:
                    out.append(f"{prefix}{n:0{width}d}{tail}")
    return tuple(out)


def _split_top(text: str) -> list[str]:
    """Split on commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p for p in parts if p]


class JobId(msgspec.Struct, frozen=True, kw_only=True):
    """A Slurm job id as printed, split (``123``, ``123_4``, ``123_[1-3]``, ``123.batch``,
    ``123_4.extern``, ``123+0``, ``123+0.0``).

    Attributes:
        job: the job part before any step (``123``, ``123_4``, ``123+0``).
        base: the number the id starts with (``123``).
        array_task: the array task (``4``, ``[1-3]``), or ``None``.
        het_offset: the hetjob component, or ``None``.
        step: the step (``batch``, ``extern``, ``0``), or ``None`` for the job itself.
    """

    job: str
    base: str
    array_task: str | None = None
    het_offset: str | None = None
    step: str | None = None


_JOB_ID: Final = re.compile(
    r"^(?P<base>\d+)(?:_(?P<task>\d+|\[[^\]]*\]))?(?:\+(?P<het>\d+))?(?:\.(?P<step>[A-Za-z0-9_]+))?$"
)


def parse_job_id(text: str) -> JobId:
    """Split a job id (see :class:`JobId`).

    Raises:
        ParseError: not a Slurm job id.
    """
    match = _JOB_ID.match(text.strip())
    if match is None:
        raise ParseError(f"{text!r} is not a Slurm job id")
    step = match.group("step")
    job = text.strip() if step is None else text.strip()[: -(len(step) + 1)]
    return JobId(
        job=job,
        base=match.group("base"),
        array_task=match.group("task"),
        het_offset=match.group("het"),
        step=step,
    )


# -- dispatch's tag in the comment -------------------------------------------------------------


class DispatchTag(msgspec.Struct, frozen=True, kw_only=True):
    """What dispatch writes into a job's ``--comment``:
    ``dj:job=<job> sub=<N> att=<a> gen=<G>`` (``gen`` optional when read)."""

    job: str
    submission: int
    attempt: int
    generation: int | None = None


def format_comment(tag: DispatchTag) -> str:
    """The ``--comment`` dispatch submits with (no spaces inside a value)."""
    gen = "" if tag.generation is None else f" gen={tag.generation}"
    return f"dj:job={tag.job} sub={tag.submission} att={tag.attempt}{gen}"


def _positive(value: str | None) -> int | None:
    if value is None or not value.isdigit() or value.startswith("0"):
        return None
    return int(value)


def parse_comment(comment: str) -> DispatchTag | None:
    """Read dispatch's tag from a comment; ``None`` when it is not one dispatch wrote (no
    ``dj:`` prefix, a missing or non-positive ``sub``/``att``): the object is then foreign
    (seed 002). Unknown keys are ignored, so a later version may add some."""
    comment = comment.strip()
    if not comment.startswith("dj:"):
        return None
    fields: dict[str, str] = {}
    for token in comment[3:].split():
        key, sep, value = token.partition("=")
        if not sep or key in fields:
            return None
        fields[key] = value
    job = fields.get("job")
    submission, attempt = _positive(fields.get("sub")), _positive(fields.get("att"))
    if not job or submission is None or attempt is None:
        return None
    gen_text = fields.get("gen")
    generation = int(gen_text) if gen_text is not None and gen_text.isdigit() else None
    return DispatchTag(job=job, submission=submission, attempt=attempt, generation=generation)


# -- squeue ------------------------------------------------------------------------------------


class QueueJob(msgspec.Struct, frozen=True, kw_only=True):
    """One job as slurmctld shows it (squeue), whichever format it came in.

    Attributes:
        raw_id: the job's own id (``JobIDRaw``: an array task has its own, e.g. ``12`` for
            ``9_1``); what dispatch uses as the object id.
        display_id: the id as users see it (``9_1``, ``9_[1-3]``, ``16``).
        array_job_id: the array's id, or ``None``.
        array_task: the task (``1``, ``1-3`` while pending), or ``None``.
        name: ``--job-name``.
        state: the base state (``PENDING``, ``RUNNING``, ``COMPLETING``, ``FAILED``, ...).
        flags: further state flags (JSON lists from v0.0.40: ``COMPLETING``, ``REQUEUED``).
        reason: the state reason (``None``, ``JobHeldUser``, ``NonZeroExitCode``, ...).
        restarts: the restart count (``-O RestartCnt``, json ``restart_cnt``).
        comment: the comment (``""`` for none).
        nodes: the nodes, expanded.
        exit: the exit status, when the format carries it.
        submit, start, end: times, when set (``end`` of a running job is a guess: don't
            trust it, deploy/slurm/README.md).
        partition: the partition.
        user: the owner's name, when the format carries it.
    """

    raw_id: str
    display_id: str
    name: str
    state: str
    array_job_id: str | None = None
    array_task: str | None = None
    flags: frozenset[str] = frozenset()
    reason: str = ""
    restarts: int = 0
    comment: str = ""
    nodes: tuple[str, ...] = ()
    exit: ExitStatus | None = None
    submit: datetime | None = None
    start: datetime | None = None
    end: datetime | None = None
    partition: str = ""
    user: str = ""


QUEUE_FIELDS: Final = (
    "JobID",
    "JobArrayID",
    "ArrayJobID",
    "ArrayTaskID",
    "Name",
    "State",
    "Reason",
    "RestartCnt",
    "exit_code",
    "Partition",
    "NodeList",
    "SubmitTime",
    "StartTime",
    "EndTime",
    "UserName",
    "Comment",
)
"""The ``squeue -O`` fields the backend asks for, each followed by ``|``. ``Comment`` is last
so that a ``|`` inside a comment can't shift the other fields."""

_NULLS: Final = frozenset({"", "(null)", "N/A"})


def _text_value(value: str) -> str:
    value = value.strip()
    return "" if value in _NULLS else value


def parse_squeue_text(text: str, fields: Sequence[str] = QUEUE_FIELDS) -> list[QueueJob]:
    """Parse ``squeue -h -O 'F1:|,F2:|,...'`` (every field ends with ``|``).

    Args:
        text: the output.
        fields: the ``-O`` field names, in order (case-insensitive); the last one may
            contain ``|`` (it gets the rest of the line). ``JobID``, ``Name`` and
            ``State`` are required.

    Raises:
        ParseError: a line with too few fields, or a value that doesn't parse.
    """
    names = [f.lower() for f in fields]
    for required in ("jobid", "name", "state"):
        if required not in names:
            raise ParseError(f"squeue fields {list(fields)} lack {required}")
    jobs = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split("|", len(names) - 1)
        if len(parts) < len(names):
            raise ParseError(f"squeue line {line!r}: {len(parts)} fields, expected {len(names)}")
        last = parts[-1]
        parts[-1] = last[:-1] if last.endswith("|") else last
        row = dict(zip(names, parts, strict=True))
        jobs.append(_queue_job_from_text(row, line))
    return jobs


def _queue_job_from_text(row: Mapping[str, str], line: str) -> QueueJob:
    raw_id = row["jobid"].strip()
    if not raw_id.isdigit():
        raise ParseError(f"squeue line {line!r}: JobID {raw_id!r} is not a number")
    display = _text_value(row.get("jobarrayid", "")) or raw_id
    array_job = _text_value(row.get("arrayjobid", ""))
    task = _text_value(row.get("arraytaskid", ""))
    is_array = bool(task)
    restarts = _text_value(row.get("restartcnt", "")) or "0"
    exit_raw = _text_value(row.get("exit_code", ""))
    try:
        return QueueJob(
            raw_id=raw_id,
            display_id=display,
            name=row["name"].strip(),
            state=row["state"].strip(),
            array_job_id=array_job if is_array else None,
            array_task=task or None,
            reason=_text_value(row.get("reason", "")),
            restarts=int(restarts),
            comment=_text_value(row.get("comment", "")),
            nodes=expand_hostlist(row.get("nodelist", "")),
            exit=wait_status(int(exit_raw)) if exit_raw else None,
            submit=parse_slurm_time(row.get("submittime", "")),
            start=parse_slurm_time(row.get("starttime", "")),
            end=parse_slurm_time(row.get("endtime", "")),
            partition=_text_value(row.get("partition", "")),
            user=_text_value(row.get("username", "")),
        )
    except ValueError as err:
        raise ParseError(f"squeue line {line!r}: {err}") from err


_BASE_STATES: Final = frozenset(
    {
        "PENDING",
        "RUNNING",
        "SUSPENDED",
        "COMPLETED",
        "CANCELLED",
        "FAILED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "OUT_OF_MEMORY",
    }
)
"""Slurm's base job states (``JOB_STATE_BASE``); everything else in a v0.0.40+ state list is
a flag (``COMPLETING``, ``REQUEUED``, ``CONFIGURING``, ...)."""


def _number(value: Any) -> int | None:
    """An integer, or a ``{"set", "infinite", "number"}`` struct (v0.0.39+); ``None`` when
    unset or infinite."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value)
    if isinstance(value, Mapping):
        if not value.get("set", False) or value.get("infinite", False):
            return None
        return _number(value.get("number"))
    return None


def _json_exit(value: Any) -> ExitStatus | None:
    """Read ``exit_code``: a raw wait status (v0.0.38) or a ``process_exit_code_verbose``
    object (v0.0.40+: ``status`` list, ``return_code``, ``signal.id``)."""
    if isinstance(value, Mapping):
        status = value.get("status")
        statuses = {status} if isinstance(status, str) else set(status or ())
        if "PENDING" in statuses and len(statuses) == 1:
            return None
        signal_obj = value.get("signal") or {}
        signal = _number(signal_obj.get("id", signal_obj.get("signal_id"))) or 0
        code = _number(value.get("return_code")) or 0
        if "SIGNALED" in statuses or "CORE_DUMPED" in statuses:
            return ExitStatus(0 if code == 0 else code, signal)
        return ExitStatus(code, signal)
    number = _number(value)
    return None if number is None else wait_status(number)


def _json_state(value: Any) -> tuple[str, frozenset[str]]:
    if isinstance(value, str):
        return value, frozenset()
    if isinstance(value, list) and value:
        states = [str(s) for s in value]
        base = next((s for s in states if s in _BASE_STATES), states[0])
        return base, frozenset(s for s in states if s != base)
    raise ParseError(f"job_state {value!r} is neither a string nor a list")


def _json_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, Mapping):  # sacct-style {"job": ...} comments of later versions
        return str(value.get("job") or "")
    return str(value)


def parse_squeue_json(document: str | bytes | Mapping[str, Any]) -> list[QueueJob]:
    """Parse ``squeue --json`` of openapi v0.0.38 (22.05) through v0.0.41 (24.05+).

    It ignores ``-j``, ``-t`` and ``-u`` (lab trap): every job slurmctld holds is returned;
    filter afterwards.

    Raises:
        ParseError: not JSON, no ``jobs`` list, or a job without ``job_id``/``job_state``.
    """
    if isinstance(document, Mapping):
        data: Any = document
    else:
        try:
            data = json.loads(document)
        except ValueError as err:
            raise ParseError(f"squeue --json printed no JSON: {err}") from err
    jobs = data.get("jobs") if isinstance(data, Mapping) else None
    if not isinstance(jobs, list):
        raise ParseError("squeue --json: no 'jobs' list")
    return [_queue_job_from_json(job) for job in jobs]


def _queue_job_from_json(job: Mapping[str, Any]) -> QueueJob:
    raw = _number(job.get("job_id"))
    if raw is None or "job_state" not in job:
        raise ParseError(f"squeue --json: a job without job_id/job_state: {dict(job)!r:.200}")
    state, flags = _json_state(job["job_state"])
    array_job = _number(job.get("array_job_id")) or 0
    task_id = _number(job.get("array_task_id"))
    task_string = str(job.get("array_task_string") or "")
    array_task: str | None = None
    display = str(raw)
    if array_job:
        if task_id is not None:
            array_task = str(task_id)
            display = f"{array_job}_{task_id}"
        elif task_string:
            array_task = task_string
            display = f"{array_job}_[{task_string}]"
    return QueueJob(
        raw_id=str(raw),
        display_id=display,
        name=str(job.get("name") or ""),
        state=state,
        flags=flags,
        array_job_id=str(array_job) if array_job else None,
        array_task=array_task,
        reason=str(job.get("state_reason") or ""),
        restarts=_number(job.get("restart_cnt")) or 0,
        comment=_json_text(job.get("comment")),
        nodes=expand_hostlist(str(job.get("nodes") or "")),
        exit=_json_exit(job.get("exit_code")),
        submit=_epoch_time(_number(job.get("submit_time"))),
        start=_epoch_time(_number(job.get("start_time"))),
        end=_epoch_time(_number(job.get("end_time"))),
        partition=str(job.get("partition") or ""),
        user=str(job.get("user_name") or ""),
    )


# -- sacct -------------------------------------------------------------------------------------


class AcctRow(msgspec.Struct, frozen=True, kw_only=True):
    """One row of ``sacct -P -n --duplicates`` (or ``sacct -c``, the jobcomp file).

    Attributes:
        job_id: ``JobID`` as printed, split (``9_1.batch``).
        raw_id: the job's own id (``JobIDRaw`` without the step; ``JobID``'s base when the
            format has no ``JobIDRaw``).
        name: ``JobName`` (``allocation`` while sacct lags, deploy/slurm/README.md).
        state: ``State`` verbatim (``CANCELLED by 0``, ``PREEMPTED``, ``NODE_FAIL``).
        exit: ``ExitCode``, or ``None`` when empty (a node-failed batch step).
        reason: ``Reason``: the last *pending* reason, never why it ended.
        nodes: ``NodeList``, expanded.
        submit, start, end: times.
        db_index: ``DBIndex`` (one per run of a requeued job), when printed.
        partition, comment: as printed.
    """

    job_id: JobId
    raw_id: str
    name: str
    state: str
    exit: ExitStatus | None = None
    reason: str = ""
    nodes: tuple[str, ...] = ()
    submit: datetime | None = None
    start: datetime | None = None
    end: datetime | None = None
    db_index: int | None = None
    partition: str = ""
    comment: str = ""
    max_rss: str = ""
    req_mem: str = ""
    alloc_tres: str = ""
    submit_line: str = ""

    @property
    def memory_request(self) -> str:
        """The memory the row was given, in Slurm's words: ``AllocTRES``'s ``mem=`` (the
        allocation; a step's is its own), else ``ReqMem``; ``""`` when neither says."""
        return tres_value(self.alloc_tres, "mem") or self.req_mem

    @property
    def tag(self) -> DispatchTag | None:
        """dispatch's tag, from ``Comment`` (stored only with ``AccountingStoreFlags=
        job_comment``) or else from ``SubmitLine``, which 22.05 stores by default and which
        holds sbatch's ``--comment=dj:...`` argument (deploy/slurm/README.md,
        ``dj-comment``)."""
        return parse_comment(self.comment) or comment_from_submit_line(self.submit_line)

    @property
    def step(self) -> str | None:
        """The step (``batch``, ``extern``, ``0``), or ``None`` for the job's own row."""
        return self.job_id.step

    @property
    def base_state(self) -> str:
        """The state's first word (``CANCELLED`` of ``CANCELLED by 0``)."""
        return self.state.split(" ", 1)[0]


ACCT_FIELDS: Final = (
    "JobID",
    "JobIDRaw",
    "JobName",
    "Partition",
    "State",
    "ExitCode",
    "Reason",
    "NodeList",
    "Submit",
    "Start",
    "End",
    "DBIndex",
    "MaxRSS",
    "ReqMem",
    "AllocTRES",
    "Comment",
    "SubmitLine",
)
"""The ``sacct -o`` fields the backend asks for (``Comment`` and ``SubmitLine`` last: they
may hold ``|``; dispatch's own comment never does, so only a foreign job's row can be
shifted, and only in those two fields). ``MaxRSS``, ``ReqMem`` and ``AllocTRES`` corroborate
an out-of-memory end (:func:`~dispatch_backends.slurm.causes.step_verdict`)."""

JOBCOMP_FIELDS: Final = tuple(f for f in ACCT_FIELDS if f != "AllocTRES")
"""The fields asked of ``sacct -c`` (the jobcomp file): 22.05's ``sacct -c -o AllocTRES``
crashes (segmentation fault, exit 139, measured on the test cluster); the others print
empty where the file has nothing."""

_MEMORY: Final = re.compile(r"^(\d+(?:\.\d+)?)([KMGTP]?)[nc]?$")
_UNITS: Final = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5}


def parse_memory(text: str) -> int | None:
    """Bytes of a Slurm memory figure (``450384K``, ``100M``, ``1.50G``, ``100Mn``;
    no suffix is bytes); ``None`` for an empty or unreadable field."""
    match = _MEMORY.match(text.strip())
    if match is None:
        return None
    return int(float(match.group(1)) * _UNITS[match.group(2)])


def tres_value(tres: str, name: str) -> str:
    """The value of ``name`` in a TRES list (``cpu=1,mem=100M,node=1``), or ``""``."""
    for item in tres.split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip() == name:
            return value.strip()
    return ""


def comment_from_submit_line(line: str) -> DispatchTag | None:
    """dispatch's tag from an ``sbatch`` command line as sacct's ``SubmitLine`` prints it
    (the arguments joined by spaces, unquoted: ``--comment=dj:job=abc sub=1 att=1
    --time=1``): the words after ``--comment=`` up to the next option."""
    at = line.find("--comment=dj:")
    if at < 0:
        return None
    words = line[at + len("--comment=") :].split(" ")
    kept = [words[0]]
    for word in words[1:]:
        if not word or word.startswith("-") or "=" not in word:
            break
        kept.append(word)
    return parse_comment(" ".join(kept))


def parse_sacct(text: str, fields: Sequence[str] = ACCT_FIELDS) -> list[AcctRow]:
    """Parse ``sacct -P -n -o F1,F2,...`` (also ``sacct -c``).

    Args:
        text: the output.
        fields: the ``-o`` field names, in order (case-insensitive; ``JobID`` and
            ``State`` are required); the last one gets the rest of the line.

    Raises:
        ParseError: a line with too few fields, or a value that doesn't parse.
    """
    names = [f.lower() for f in fields]
    for required in ("jobid", "state"):
        if required not in names:
            raise ParseError(f"sacct fields {list(fields)} lack {required}")
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split("|", len(names) - 1)
        if len(parts) < len(names):
            raise ParseError(f"sacct line {line!r}: {len(parts)} fields, expected {len(names)}")
        row = dict(zip(names, parts, strict=True))
        rows.append(_acct_row(row, line))
    return rows


def _acct_row(row: Mapping[str, str], line: str) -> AcctRow:
    try:
        job_id = parse_job_id(row["jobid"])
        raw_text = row.get("jobidraw", "").strip()
        raw_id = parse_job_id(raw_text).base if raw_text else job_id.base
        db_index = row.get("dbindex", "").strip()
        return AcctRow(
            job_id=job_id,
            raw_id=raw_id,
            name=row.get("jobname", "").strip(),
            state=row["state"].strip(),
            exit=parse_exit(row.get("exitcode", "")),
            reason=row.get("reason", "").strip(),
            nodes=expand_hostlist(row.get("nodelist", "")),
            submit=parse_slurm_time(row.get("submit", "")),
            start=parse_slurm_time(row.get("start", "")),
            end=parse_slurm_time(row.get("end", "")),
            db_index=int(db_index) if db_index.isdigit() else None,
            partition=row.get("partition", "").strip(),
            comment=row.get("comment", "").strip(),
            max_rss=row.get("maxrss", "").strip(),
            req_mem=row.get("reqmem", "").strip(),
            alloc_tres=row.get("alloctres", "").strip(),
            submit_line=row.get("submitline", "").strip(),
        )
    except ValueError as err:
        raise ParseError(f"sacct line {line!r}: {err}") from err


def runs(rows: Iterable[AcctRow], raw_id: str) -> list[AcctRow]:
    """The job rows (no steps) of job ``raw_id``, one per run, oldest first (by
    ``DBIndex`` when printed, else as printed: sacct prints runs in order)."""
    own = [r for r in rows if r.raw_id == raw_id and r.step is None]
    if all(r.db_index is not None for r in own):
        own.sort(key=lambda r: r.db_index or 0)
    return own


def steps_of(rows: Iterable[AcctRow], run: AcctRow) -> list[AcctRow]:
    """The step rows of one run (``run``, a job row): same raw id and, when printed, the
    same ``DBIndex`` (sacct gives each step its run's, as recorded in ``oom/end``); without
    ``DBIndex``, the steps printed after ``run`` and before the job's next run."""
    own = [r for r in rows if r.raw_id == run.raw_id]
    if run.db_index is not None:
        return [r for r in own if r.step is not None and r.db_index == run.db_index]
    out: list[AcctRow] = []
    started = False
    for row in own:
        if row is run:
            started = True
        elif row.step is None and started:
            break
        elif started:
            out.append(row)
    return out


# -- sinfo -------------------------------------------------------------------------------------


class NodeState(msgspec.Struct, frozen=True, kw_only=True):
    """A node as ``sinfo -h -N -O 'NodeList:|,StateComplete:|,Reason:|'`` shows it.

    Attributes:
        name: the node.
        state: ``StateComplete`` verbatim: the base state and every flag, ``+``-joined
            (``mixed+fail``, ``down+not_responding``, ``idle+drain``); a ``%T``-style state
            (``allocated*``, ``down``) is read too.
        reason: the reason (``none`` when none).
    """

    name: str
    state: str
    reason: str = ""

    @property
    def parts(self) -> tuple[str, ...]:
        """The base state, then its flags, lower case, without ``%T``'s suffixes."""
        return tuple(p.rstrip("*~#!%$@^-").lower() for p in self.state.split("+") if p)

    @property
    def base(self) -> str:
        """The base state (``mixed`` of ``mixed+fail``, ``down`` of ``down*``)."""
        return self.parts[0] if self.parts else ""

    @property
    def not_responding(self) -> bool:
        """slurmctld gets no answer from its slurmd (``*`` in ``%T``, ``not_responding`` in
        ``StateComplete``)."""
        return self.state.split("+")[0].endswith("*") or "not_responding" in self.parts[1:]

    @property
    def lost(self) -> bool:
        """Whether a job on it has lost it: not responding, or down. A ``fail`` flag
        (``state=fail`` while a job runs: ``mixed+fail``, sinfo ``%T`` ``failing`` or, as
        measured, sometimes ``fail``) is not: the job goes on (slurm-lab README, "node
        state=fail while a job runs")."""
        return self.not_responding or self.base == "down"


SINFO_FIELDS: Final = ("NodeList", "StateComplete", "Reason")
"""The ``sinfo -N -O`` fields the backend asks for, each followed by ``|``. ``%T`` is not
used: on a node in ``mixed+fail`` it printed ``failing`` once and ``fail`` the next time."""


def parse_sinfo(text: str) -> dict[str, NodeState]:
    """Parse ``sinfo -h -N -O 'NodeList:|,StateComplete:|,Reason:|'`` (or ``-o
    '%N|%T|%E'``); a node is listed once per partition, the first line wins.

    Raises:
        ParseError: a line without two ``|``.
    """
    nodes: dict[str, NodeState] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split("|", 2)
        if len(parts) < 3:
            raise ParseError(f"sinfo line {line!r}: expected <node>|<state>|<reason>")
        name, state, reason = parts[0].strip(), parts[1].strip(), parts[2].strip()
        reason = reason[:-1] if reason.endswith("|") else reason
        nodes.setdefault(name, NodeState(name=name, state=state, reason=reason))
    return nodes


# -- scontrol ----------------------------------------------------------------------------------

_SCONTROL_KEY: Final = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_/:]*)=")


def parse_scontrol(line: str) -> dict[str, str]:
    """Parse one ``scontrol -o show job`` line into its ``Key=Value`` pairs.

    Values are printed unquoted (``Comment=dj:job=abc sub=1 att=1``), so a value runs to
    the next ``<space>Key=`` whose key starts with a capital letter and is followed by
    more pairs; words of a value that look like ``key=value`` in lower case
    (``sub=1``) stay in the value.
    """
    line = line.rstrip("\n")
    starts = [m for m in _SCONTROL_KEY.finditer(line) if m.group(1)[0].isupper() or m.start(1) == 0]
    out: dict[str, str] = {}
    for i, match in enumerate(starts):
        end = starts[i + 1].start() if i + 1 < len(starts) else len(line)
        out[match.group(1)] = line[match.end() : end].strip()
    return out
