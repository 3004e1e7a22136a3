"""Errors raised by dispatch_nats: one root, `NatsStoreError`, with a `retryable` flag.

`retryable` tells a service loop whether trying the same operation again later can succeed
(nak with a delay) or whether it never will without a change of code or config (term, log,
alert). Library errors (nats-py, the JetStream API) are translated here with `from err`, so
callers never catch `nats.*` exceptions.
"""

from __future__ import annotations

from typing import ClassVar, Final

__all__ = [
    "AppendOutcomeUnknown",
    "ConcurrencyConflict",
    "ContractVersionMismatch",
    "InvalidName",
    "JetStreamApiError",
    "JetStreamTemporaryError",
    "MsgIdReused",
    "NatsStoreError",
    "PayloadTooLarge",
    "StaleRead",
    "StoreUnavailable",
    "StreamConfigConflict",
    "StreamNotFound",
]


class NatsStoreError(Exception):
    """Root of all dispatch_nats errors."""

    retryable: ClassVar[bool] = False


class InvalidName(NatsStoreError, ValueError):
    """A job id, cluster name, namespace or message id can't be used in a subject or header."""

    def __init__(self, kind: str, value: str, rule: str) -> None:
        super().__init__(f"invalid {kind} {value!r}: {rule}")
        self.kind, self.value, self.rule = kind, value, rule


class ConcurrencyConflict(NatsStoreError):
    """Another writer extended the job's record first: `expected` is no longer its last seq.

    The caller re-reads the record, re-folds, re-decides, and appends again with the new last
    sequence. That makes it retryable: the same pass run again on fresh state can succeed.
    """

    retryable: ClassVar[bool] = True

    def __init__(self, job_id: str, expected: int, actual: int) -> None:
        super().__init__(
            f"job {job_id!r}: record append expected last seq {expected}, but the record's "
            f"last seq is {actual}"
        )
        self.job_id, self.expected, self.actual = job_id, expected, actual


class AppendOutcomeUnknown(NatsStoreError):
    """An append got no answer in time, and reading the record has not settled whether it landed.

    It may still be stored (a timed-out publish is not a failed one). Retrying the same append
    (same `msg_id`, same `expected_last_seq`) is safe: it returns the stored seq if the first
    try landed, stores it once otherwise, or raises `ConcurrencyConflict`.
    """

    retryable: ClassVar[bool] = True

    def __init__(self, job_id: str, msg_id: str, expected: int, attempts: int) -> None:
        super().__init__(
            f"job {job_id!r}: append of msg id {msg_id!r} after seq {expected} has an unknown "
            f"outcome after {attempts} attempt(s) with no answer from JetStream; retry it with "
            "the same msg id"
        )
        self.job_id, self.msg_id, self.expected, self.attempts = job_id, msg_id, expected, attempts


class MsgIdReused(NatsStoreError):
    """JetStream deduplicated an append against a message that is not this job's event.

    The `Nats-Msg-Id` window is per stream, so a msg id already used on another job's subject
    (within the duplicate window) blocks this append. It is a caller bug: msg ids must be unique.
    """

    def __init__(self, job_id: str, msg_id: str, seq: int, subject: str) -> None:
        super().__init__(
            f"job {job_id!r}: msg id {msg_id!r} was already used by seq {seq} on subject "
            f"{subject!r}; msg ids must be unique per event"
        )
        self.job_id, self.msg_id, self.seq, self.subject = job_id, msg_id, seq, subject


class PayloadTooLarge(NatsStoreError):
    """A message is larger than the server's `max_payload` (1 MiB by default)."""

    def __init__(self, subject: str, size: int, limit: int) -> None:
        super().__init__(f"message of {size} bytes to {subject!r} exceeds max_payload {limit}")
        self.subject, self.size, self.limit = subject, size, limit


class StreamConfigConflict(NatsStoreError):
    """A stream exists with a configuration that contradicts the contract (or can't be created)."""

    def __init__(self, stream: str, differences: list[str]) -> None:
        super().__init__(
            f"stream {stream!r} conflicts with the dispatch contract: " + "; ".join(differences)
        )
        self.stream, self.differences = stream, differences


class ContractVersionMismatch(StreamConfigConflict):
    """A stream was made for another version of the NATS contract (e.g. v1's record subjects
    without the writer kind); the message says what to do."""

    def __init__(self, stream: str, found: str | None, wanted: int, what_to_do: str) -> None:
        found_text = f"v{found}" if found else "no version (not made by dispatch)"
        advice = what_to_do or (
            f"run the build that speaks {found_text}, or move the stream aside and let this "
            "build create it anew"
        )
        StreamConfigConflict.__init__(
            self,
            stream,
            [f"it was made for NATS contract {found_text}; this build speaks v{wanted}: {advice}"],
        )
        self.found, self.wanted = found, wanted


class StoreUnavailable(NatsStoreError):
    """NATS did not answer in time, or the connection is closed or draining."""

    retryable: ClassVar[bool] = True

    def __init__(self, what: str, detail: str) -> None:
        super().__init__(f"{what}: {detail}")
        self.what, self.detail = what, detail


class StreamNotFound(NatsStoreError):
    """No stream answered for a subject: the stream is missing or (in a cluster) has no leader.

    Retryable because a leader election answers no one for a few seconds; a stream that was
    never created (no `ensure_streams` at start-up) keeps raising it.
    """

    retryable: ClassVar[bool] = True

    def __init__(self, stream: str, subject: str) -> None:
        super().__init__(
            f"no stream answered for {subject!r}: stream {stream!r} is missing (run "
            "ensure_streams at start-up) or is electing a leader"
        )
        self.stream, self.subject = stream, subject


class StaleRead(NatsStoreError):
    """A read came from a replica behind the stream's leader and stayed behind.

    Direct gets may be answered by any replica, one still catching up after a restart or a
    leader change included. A reader that must not act on less than what is stored (a pass
    whose wake must not be acknowledged with nothing done) checks its read against the
    leader's last seq and raises this if it never caught up: retry later.
    """

    retryable: ClassVar[bool] = True

    def __init__(self, what: str, wanted: int, got: int) -> None:
        super().__init__(
            f"{what}: the read reached seq {got}, but the stream's leader holds seq {wanted}; "
            "a replica is catching up, try again"
        )
        self.what, self.wanted, self.got = what, wanted, got


class JetStreamApiError(NatsStoreError):
    """JetStream refused a request with an API error the store does not handle itself."""

    def __init__(self, what: str, code: int, err_code: int, description: str) -> None:
        super().__init__(f"{what}: JetStream error {code}/{err_code}: {description}")
        self.what, self.code, self.err_code, self.description = what, code, err_code, description


class JetStreamTemporaryError(JetStreamApiError):
    """JetStream said it is temporarily unable (503) or failed internally (500): try again later."""

    retryable: ClassVar[bool] = True


_TEMPORARY_ERR_CODES: Final = frozenset(
    {
        10005,  # no suitable peers for placement: a server of the cluster is down or rejoining
        10008,  # JetStream system temporarily unavailable: no meta leader yet
        10009,  # the cluster can't handle the request: leader changing
        10118,  # stream is offline
        10119,  # consumer is offline
        10164,  # wrong last sequence (no number): an earlier write still replicating
    }
)


def api_error(what: str, code: int, err_code: int, description: str) -> JetStreamApiError:
    """Return the error class for a JetStream API error reply: temporary for 500/503 and
    for the cluster's "not now" answers (no meta leader, peers missing, offline)."""
    temporary = code in (500, 503) or err_code in _TEMPORARY_ERR_CODES
    cls = JetStreamTemporaryError if temporary else JetStreamApiError
    return cls(what, code, err_code, description)
