"""The NATS contract of dispatch: streams, subjects and headers (public, versioned).

Users subscribe to these subjects, so this module is the one place that names them, and the
README cites it. A change that an existing reader or an existing stream would notice bumps
`CONTRACT_VERSION` (stamped into each stream's metadata as `dispatch.contract`).

Subjects (`<job>` and `<cluster>` are tokens of lower-case letters, digits and `-`):

`dispatch.record.<job>.<writer>` in stream `DISPATCH_RECORD` (stream subjects
`dispatch.record.*.*`)
    The job's record: its events, append-only, in order. `<writer>` is the kind of writer
    that appended the event (`api`, `supervisor` or `notifier`: `dispatch_core.WriterKind`),
    so nats-server's permissions can let each service's identity publish only its own
    subjects, and `fold` refuses an event type its writer may not write (contract v2). A
    job's record is every message matching `dispatch.record.<job>.*`, in stream-sequence
    order. Each payload is one msgspec-encoded event; the JetStream stream sequence is the
    event's seq (it is never in the payload). Every append carries
    `Nats-Expected-Last-Subject-Sequence` (the seq of the job's last event, 0 for the first)
    with `Nats-Expected-Last-Subject-Sequence-Subject: dispatch.record.<job>.*`, so the check
    is against the job's whole record whoever wrote it and two writers never both extend the
    same version, and a `Nats-Msg-Id` (the step's idempotency key), so a retried append is
    stored once. Limits retention with no limits, `deny_delete` and `deny_purge`: nothing is
    ever removed. `allow_direct` for fast reads, `allow_atomic` for all-or-nothing
    multi-event appends.

`dispatch.discovery.<cluster>.<job>` in stream `DISPATCH_DISCOVERY`
    The latest Discovery of a job: what the observer of `<cluster>` sees of the job's
    objects in the scheduler. One message per subject (a newer one replaces the older).

`dispatch.status.<job>` in stream `DISPATCH_STATUS`
    The job's projected Status, published by the supervisor whenever it changes. One message
    per subject. Header `Dispatch-Wake-At` (`WAKE_AT_HEADER`): the job's next deadline
    (RFC 3339), absent when it has none; every supervisor replica follows these to wake the
    job when it comes.

`dispatch.work.<job>` in stream `DISPATCH_WORK`
    Requests to run a supervisor pass of the job (empty payload): a deadline that came
    (`Nats-Msg-Id: wake:<job>:<wake at>`) or a start-up catch-up
    (`catch-up:<job>:<record seq>`). Work-queue retention, so a request is removed once a
    replica has handled it; every replica may publish the same request and JetStream stores
    it once (duplicate window `DUPLICATE_WINDOW_S`). Internal to the supervisors; users have
    no reason to read it.

`dispatch.observer.<cluster>` (core NATS, no stream)
    The observer's heartbeat for `<cluster>`: reachable, or unreachable with the scheduler's
    error. Short-lived by nature, so it is not stored: a reader that missed one waits for
    the next.

`dispatch.logs.<cluster>` (core NATS request/reply, no stream)
    The API asks the observer of `<cluster>` (the only holder of its backend) for a bounded
    chunk of an object's output (`dispatch logs`); the reply goes to the API's own inbox.
    Only the API may publish there and only that cluster's observer may subscribe.

Every stream is created by `ensure_streams` at start-up (idempotent; a stream that exists
with a contradicting configuration is an error, not silently changed). Replicas are
configurable: 1 for a single server, 3 in production.

A `Layout` with a `namespace` prefixes every subject and stream name, so several dispatch
installations (or tests) can share one NATS account; the default layout is the contract
above.

Requires nats-server 2.12 or later (batch direct get and the expected-last-subject-sequence
subject header are 2.11, atomic batch publish 2.12).

Versions: 1 had one record subject per job (`dispatch.record.<job>`); 2 (this one) names the
writer kind in it. `ensure_streams` refuses the streams of another version, saying what to do.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Any, Final

from nats.aio.client import Client as NATS

from dispatch_core import WriterKind
from dispatch_nats._wire import Wire
from dispatch_nats.errors import (
    ContractVersionMismatch,
    InvalidName,
    JetStreamApiError,
    StreamConfigConflict,
)

__all__ = [
    "CONTRACT_METADATA_KEY",
    "CONTRACT_VERSION",
    "DEFAULT_LAYOUT",
    "DISCOVERY_STREAM",
    "DUPLICATE_WINDOW_S",
    "EXPECTED_LAST_SUBJECT_SEQ_HEADER",
    "EXPECTED_LAST_SUBJECT_SEQ_SUBJECT_HEADER",
    "MSG_ID_HEADER",
    "RECORD_STREAM",
    "STATUS_STREAM",
    "WAKE_AT_HEADER",
    "WORK_STREAM",
    "Layout",
    "StreamKind",
    "discovery_subject",
    "ensure_streams",
    "observer_subject",
    "record_subject",
    "status_subject",
    "validate_cluster",
    "validate_job_id",
    "work_subject",
]

CONTRACT_VERSION: Final = 2
"""Version of the stream layout and subject names; stamped into each stream's metadata."""

CONTRACT_METADATA_KEY: Final = "dispatch.contract"
"""Stream metadata key holding the `CONTRACT_VERSION` the stream was created for."""

RECORD_STREAM: Final = "DISPATCH_RECORD"
DISCOVERY_STREAM: Final = "DISPATCH_DISCOVERY"
STATUS_STREAM: Final = "DISPATCH_STATUS"
WORK_STREAM: Final = "DISPATCH_WORK"

WAKE_AT_HEADER: Final = "Dispatch-Wake-At"
"""Header of a Status message: the job's next deadline (RFC 3339), absent when none."""

EXPECTED_LAST_SUBJECT_SEQ_HEADER: Final = "Nats-Expected-Last-Subject-Sequence"
"""Header of every record append: the seq of the job's last event (0: the record is empty)."""

EXPECTED_LAST_SUBJECT_SEQ_SUBJECT_HEADER: Final = "Nats-Expected-Last-Subject-Sequence-Subject"
"""Header of every record append: the subject filter the expected seq is checked against,
`dispatch.record.<job>.*` (the job's whole record, whoever wrote it; nats-server 2.11+)."""

MSG_ID_HEADER: Final = "Nats-Msg-Id"
"""Header of every record append: the event's idempotency key, unique per event."""

DUPLICATE_WINDOW_S: Final = 120.0
"""How long JetStream remembers a `Nats-Msg-Id` of the record stream, in seconds.

Past it, the store still finds a retried append by reading the record (see `RecordStore`)."""

_TOKEN: Final = re.compile(r"[a-z0-9-]+")
_TOKEN_RULE: Final = "use lower-case letters, digits and '-' only (no dots, spaces or wildcards)"


def _validate_token(kind: str, value: str) -> str:
    if not _TOKEN.fullmatch(value):
        raise InvalidName(kind, str(value), _TOKEN_RULE)
    return value


def validate_job_id(job_id: str) -> str:
    """Return `job_id` if it is a subject-safe token.

    Raises:
        InvalidName: it is empty or has a character other than `a-z`, `0-9` and `-`.
    """
    return _validate_token("job id", job_id)


def _writer(writer: str) -> WriterKind:
    """Return `writer` as a writer kind.

    Raises:
        InvalidName: it is not one (`api`, `supervisor`, `notifier`).
    """
    try:
        return WriterKind(writer)
    except ValueError:
        kinds = ", ".join(k.value for k in WriterKind)
        raise InvalidName("writer kind", str(writer), f"use one of {kinds}") from None


def validate_cluster(cluster: str) -> str:
    """Return `cluster` if it is a subject-safe token.

    Raises:
        InvalidName: it is empty or has a character other than `a-z`, `0-9` and `-`.
    """
    return _validate_token("cluster name", cluster)


class StreamKind(enum.StrEnum):
    """The streams of the contract."""

    RECORD = "record"
    DISCOVERY = "discovery"
    STATUS = "status"
    WORK = "work"


@dataclass(frozen=True, slots=True)
class Layout:
    """Stream and subject names, optionally under a namespace.

    `Layout()` is the public contract (`dispatch.record.<job>` in `DISPATCH_RECORD`, ...).
    `Layout(namespace="t1")` gives `t1.dispatch.record.<job>` in `T1_DISPATCH_RECORD`, and so
    on: an isolated copy for tests, or a second installation on one NATS account.
    """

    namespace: str = ""
    """Prefix of every subject (`<namespace>.dispatch...`) and stream (`<NAMESPACE>_DISPATCH_...`);
    empty for the contract's own names."""

    api_prefix: str = "$JS.API"
    """JetStream API prefix (`$JS.<domain>.API` for a JetStream domain)."""

    def __post_init__(self) -> None:
        """Validate the namespace.

        Raises:
            InvalidName: the namespace is not empty and not a subject-safe token.
        """
        if self.namespace:
            _validate_token("namespace", self.namespace)

    @property
    def root(self) -> str:
        """The subject prefix: `dispatch` or `<namespace>.dispatch`."""
        return f"{self.namespace}.dispatch" if self.namespace else "dispatch"

    def stream(self, kind: StreamKind) -> str:
        """Return the stream name for `kind`, e.g. `DISPATCH_RECORD`."""
        base = f"DISPATCH_{kind.value.upper()}"
        if not self.namespace:
            return base
        return f"{self.namespace.upper().replace('-', '_')}_{base}"

    @property
    def record_stream(self) -> str:
        """Name of the record stream (`DISPATCH_RECORD`)."""
        return self.stream(StreamKind.RECORD)

    @property
    def discovery_stream(self) -> str:
        """Name of the discovery stream (`DISPATCH_DISCOVERY`)."""
        return self.stream(StreamKind.DISCOVERY)

    @property
    def status_stream(self) -> str:
        """Name of the status stream (`DISPATCH_STATUS`)."""
        return self.stream(StreamKind.STATUS)

    @property
    def work_stream(self) -> str:
        """Name of the supervisors' work stream (`DISPATCH_WORK`)."""
        return self.stream(StreamKind.WORK)

    def work_subject(self, job_id: str) -> str:
        """Return `dispatch.work.<job>`, where a pass of the job is requested.

        Raises:
            InvalidName: `job_id` is not a subject-safe token.
        """
        return f"{self.root}.work.{validate_job_id(job_id)}"

    @property
    def work_filter(self) -> str:
        """`dispatch.work.*`: every job's pass requests."""
        return f"{self.root}.work.*"

    def job_id_from_work_subject(self, subject: str) -> str:
        """Return the job id of a work subject.

        Raises:
            InvalidName: `subject` is not a work subject of this layout.
        """
        prefix = f"{self.root}.work."
        if not subject.startswith(prefix):
            raise InvalidName("work subject", subject, f"must start with {prefix!r}")
        return validate_job_id(subject[len(prefix) :])

    def record_subject(self, job_id: str, writer: WriterKind) -> str:
        """Return `dispatch.record.<job>.<writer>`, where a writer of that kind appends to the
        job's record.

        Raises:
            InvalidName: `job_id` is not a subject-safe token, or `writer` not a writer kind.
        """
        return f"{self.root}.record.{validate_job_id(job_id)}.{_writer(writer)}"

    def record_job_filter(self, job_id: str) -> str:
        """Return `dispatch.record.<job>.*`: the job's whole record, every writer's appends.

        Raises:
            InvalidName: `job_id` is not a subject-safe token.
        """
        return f"{self.root}.record.{validate_job_id(job_id)}.*"

    @property
    def record_filter(self) -> str:
        """`dispatch.record.*.*`: every job's record (the record stream's subjects)."""
        return f"{self.root}.record.*.*"

    def record_writer_filter(self, writer: WriterKind) -> str:
        """Return `dispatch.record.*.<writer>`: every append by writers of that kind (what the
        identity of such a writer may publish).

        Raises:
            InvalidName: `writer` is not a writer kind.
        """
        return f"{self.root}.record.*.{_writer(writer)}"

    def parse_record_subject(self, subject: str) -> tuple[str, WriterKind]:
        """Return the job id and writer kind of a record subject.

        Raises:
            InvalidName: `subject` is not a record subject of this layout (a v1 subject
                `dispatch.record.<job>` included).
        """
        prefix = f"{self.root}.record."
        if not subject.startswith(prefix):
            raise InvalidName("record subject", subject, f"must start with {prefix!r}")
        job_id, dot, writer = subject[len(prefix) :].partition(".")
        if not dot:
            raise InvalidName(
                "record subject", subject, f"must be {prefix}<job>.<writer> (contract v2)"
            )
        return validate_job_id(job_id), _writer(writer)

    def job_id_from_record_subject(self, subject: str) -> str:
        """Return the job id of a record subject, without checking its writer token (a read
        of the job refuses an unknown writer kind, naming the job and seq: the job's
        problem, not the problem of whoever follows every record).

        Raises:
            InvalidName: `subject` is not `dispatch.record.<job>.<token>` with a valid job id.
        """
        prefix = f"{self.root}.record."
        job_id, dot, writer = subject.removeprefix(prefix).partition(".")
        if not subject.startswith(prefix) or not dot or not writer:
            raise InvalidName(
                "record subject", subject, f"must be {prefix}<job>.<writer> (contract v2)"
            )
        return validate_job_id(job_id)

    def discovery_subject(self, cluster: str, job_id: str) -> str:
        """Return `dispatch.discovery.<cluster>.<job>`, where the job's latest Discovery is.

        Raises:
            InvalidName: `cluster` or `job_id` is not a subject-safe token.
        """
        return f"{self.root}.discovery.{validate_cluster(cluster)}.{validate_job_id(job_id)}"

    def status_subject(self, job_id: str) -> str:
        """Return `dispatch.status.<job>`, where the job's latest Status is.

        Raises:
            InvalidName: `job_id` is not a subject-safe token.
        """
        return f"{self.root}.status.{validate_job_id(job_id)}"

    def observer_subject(self, cluster: str) -> str:
        """Return `dispatch.observer.<cluster>`, the observer heartbeat subject (core NATS).

        Raises:
            InvalidName: `cluster` is not a subject-safe token.
        """
        return f"{self.root}.observer.{validate_cluster(cluster)}"

    @property
    def observer_filter(self) -> str:
        """`dispatch.observer.*`: every cluster's heartbeat."""
        return f"{self.root}.observer.*"

    def logs_subject(self, cluster: str) -> str:
        """Return `dispatch.logs.<cluster>`, where the API asks the cluster's observer for a
        chunk of an object's output (core NATS request/reply; `dispatch logs`).

        Raises:
            InvalidName: `cluster` is not a subject-safe token.
        """
        return f"{self.root}.logs.{validate_cluster(cluster)}"

    @property
    def logs_filter(self) -> str:
        """`dispatch.logs.*`: every cluster's output requests (what the API may publish)."""
        return f"{self.root}.logs.*"

    def latest_prefix(self, kind: StreamKind) -> str:
        """Subject prefix of a latest-value stream, e.g. `dispatch.status`.

        Raises:
            ValueError: `kind` is the record stream, which is not a latest-value stream.
        """
        if kind is StreamKind.RECORD:
            raise ValueError("the record stream is not a latest-value stream")
        return f"{self.root}.{kind.value}"

    def stream_configs(self, replicas: int = 1) -> list[dict[str, Any]]:
        """Return the JetStream configurations (raw API JSON) of the contract's streams.

        Args:
            replicas: copies of each stream in a cluster (1 on a single server, 3 in production).

        Raises:
            ValueError: `replicas` is not between 1 and 5.
        """
        if not 1 <= replicas <= 5:
            raise ValueError(f"replicas must be 1..5, got {replicas}")
        common: dict[str, Any] = {
            "retention": "limits",
            "storage": "file",
            "discard": "old",
            "num_replicas": replicas,
            "allow_direct": True,
            "metadata": {CONTRACT_METADATA_KEY: str(CONTRACT_VERSION)},
        }
        return [
            {
                **common,
                "name": self.record_stream,
                "description": (
                    "dispatch job records: append-only events, one subject per job and writer kind"
                ),
                "subjects": [self.record_filter],
                "max_msgs_per_subject": -1,
                "duplicate_window": int(DUPLICATE_WINDOW_S * 1e9),
                "deny_delete": True,
                "deny_purge": True,
                "allow_atomic": True,
            },
            {
                **common,
                "name": self.discovery_stream,
                "description": "dispatch: latest Discovery per cluster and job",
                "subjects": [f"{self.latest_prefix(StreamKind.DISCOVERY)}.*.*"],
                "max_msgs_per_subject": 1,
            },
            {
                **common,
                "name": self.status_stream,
                "description": "dispatch: latest Status per job",
                "subjects": [f"{self.latest_prefix(StreamKind.STATUS)}.*"],
                "max_msgs_per_subject": 1,
            },
            {
                **common,
                "name": self.work_stream,
                "description": "dispatch: supervisor pass requests (deadlines, catch-up)",
                "subjects": [self.work_filter],
                "retention": "workqueue",
                "duplicate_window": int(DUPLICATE_WINDOW_S * 1e9),
            },
        ]


DEFAULT_LAYOUT: Final = Layout()
"""The public contract's names."""


def record_subject(job_id: str, writer: WriterKind) -> str:
    """Return `dispatch.record.<job>.<writer>` (see `Layout.record_subject`)."""
    return DEFAULT_LAYOUT.record_subject(job_id, writer)


def discovery_subject(cluster: str, job_id: str) -> str:
    """Return `dispatch.discovery.<cluster>.<job>` (see `Layout.discovery_subject`)."""
    return DEFAULT_LAYOUT.discovery_subject(cluster, job_id)


def status_subject(job_id: str) -> str:
    """Return `dispatch.status.<job>` (see `Layout.status_subject`)."""
    return DEFAULT_LAYOUT.status_subject(job_id)


def work_subject(job_id: str) -> str:
    """Return `dispatch.work.<job>` (see `Layout.work_subject`)."""
    return DEFAULT_LAYOUT.work_subject(job_id)


def observer_subject(cluster: str) -> str:
    """Return `dispatch.observer.<cluster>` (see `Layout.observer_subject`)."""
    return DEFAULT_LAYOUT.observer_subject(cluster)


# Fields of a stream's configuration that the contract fixes. Others (limits on bytes,
# placement, compression, ...) are the operator's to tune and are left alone.
_CONTRACT_FIELDS: Final = (
    "subjects",
    "retention",
    "storage",
    "discard",
    "num_replicas",
    "max_msgs_per_subject",
    "duplicate_window",
    "deny_delete",
    "deny_purge",
    "allow_direct",
    "allow_atomic",
)

_ERR_STREAM_NOT_FOUND: Final = 10059
_ERR_STREAM_NAME_IN_USE: Final = 10058
_ERR_SUBJECTS_OVERLAP: Final = 10065


def _differences(wanted: dict[str, Any], actual: dict[str, Any]) -> list[str]:
    diffs = []
    for field in _CONTRACT_FIELDS:
        if field not in wanted:
            continue
        want, have = wanted[field], actual.get(field)
        if field == "subjects":
            want, have = sorted(want), sorted(have or [])
        if have is None and want is False:
            have = False  # the server omits false booleans it doesn't know
        if want != have:
            diffs.append(f"{field}: stream has {have!r}, contract wants {want!r}")
    version = (actual.get("metadata") or {}).get(CONTRACT_METADATA_KEY)
    if version != str(CONTRACT_VERSION):
        diffs.append(
            f"metadata {CONTRACT_METADATA_KEY}: stream has {version!r}, "
            f"contract wants {str(CONTRACT_VERSION)!r}"
        )
    return diffs


async def ensure_streams(
    nc: NATS,
    replicas: int = 1,
    *,
    layout: Layout = DEFAULT_LAYOUT,
    timeout_s: float = 5.0,
) -> None:
    """Create the contract's streams if missing; check them if present. Idempotent.

    A stream that exists is not changed: if a field the contract fixes differs (subjects,
    retention, storage, replicas, per-subject limit, duplicate window, deny_delete/purge,
    allow_direct/atomic, or the contract version in its metadata), this raises instead, so a
    wrongly configured or newer deployment is found at start-up rather than by a lost event.
    Fields the contract does not fix (byte limits, placement, ...) may be tuned by operators.

    Args:
        nc: a connected NATS client.
        replicas: copies of each stream (1 on a single server, 3 in production).
        layout: the names to use; the contract's by default.
        timeout_s: how long to wait for each JetStream API reply, in seconds.

    Raises:
        StreamConfigConflict: a stream exists with a contradicting configuration, another
            stream already owns the subjects, or the server ignored a field it does not
            support (nats-server older than 2.12).
        StoreUnavailable: JetStream did not answer (not enabled, or the connection is down).
        JetStreamApiError: JetStream refused a request for another reason.
    """
    wire = Wire(nc)
    try:
        for config in layout.stream_configs(replicas):
            await _ensure_stream(wire, layout, config, timeout_s)
    finally:
        await wire.close()


async def _ensure_stream(
    wire: Wire, layout: Layout, config: dict[str, Any], timeout_s: float
) -> None:
    name = config["name"]
    info_subject = f"{layout.api_prefix}.STREAM.INFO.{name}"
    try:
        info = await wire.api("stream info", info_subject, None, timeout_s=timeout_s)
    except JetStreamApiError as err:
        if err.err_code != _ERR_STREAM_NOT_FOUND:
            raise
    else:
        _check(name, config, info)
        return
    create_subject = f"{layout.api_prefix}.STREAM.CREATE.{name}"
    try:
        info = await wire.api("stream create", create_subject, config, timeout_s=timeout_s)
    except JetStreamApiError as err:
        if err.err_code == _ERR_SUBJECTS_OVERLAP:
            raise StreamConfigConflict(
                name, [f"another stream already holds subjects {config['subjects']}"]
            ) from err
        if err.err_code != _ERR_STREAM_NAME_IN_USE:
            raise
        # Created by another process between our info and create: check theirs.
        info = await wire.api("stream info", info_subject, None, timeout_s=timeout_s)
    _check(name, config, info)


def _check(name: str, wanted: dict[str, Any], info: dict[str, Any]) -> None:
    actual = info.get("config") or {}
    version = (actual.get("metadata") or {}).get(CONTRACT_METADATA_KEY)
    if version != str(CONTRACT_VERSION):
        found = None if version is None else str(version)
        advice = _UPGRADE.get(found or "", "")
        raise ContractVersionMismatch(name, found, CONTRACT_VERSION, advice)
    diffs = _differences(wanted, actual)
    if diffs:
        raise StreamConfigConflict(name, diffs)


_UPGRADE: Final = {
    "1": (
        "contract v1 kept a job's record on one subject (dispatch.record.<job>); v2 names the "
        "writer kind (dispatch.record.<job>.<writer>) so that permissions and fold can tell "
        "who appended each event, and a v1 record can't be read as v2. Stop every service of "
        "the old build, let it finish or cancel its jobs, back the streams up if their "
        "records matter (`nats stream backup`), delete the v1 streams (DISPATCH_RECORD, "
        "DISPATCH_DISCOVERY, DISPATCH_STATUS, DISPATCH_WORK, or your namespace's), then "
        "start this build, which creates them anew; or keep running the v1 build"
    ),
}
