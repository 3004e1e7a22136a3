"""dispatch_nats: dispatch's NATS contract and JetStream stores.

* `contract`: stream layout and subject names (the public, versioned contract), subject
  builders and `ensure_streams`.
* `RecordStore`: each job's append-only record, with optimistic concurrency and idempotent,
  outcome-resolving appends; reads, listing, and following appends across all jobs. Built
  with the writer kind it appends as (contract v2: `dispatch.record.<job>.<writer>`).
* `RecordRepository`: the one conversation with a job's record (load incremental, commit
  decisions, append facts) with its conflict and unknown-outcome handling.
* `LatestStore`: latest value per subject for the discovery and status streams.
* `RecordFeed` / `LatestFeed` (`follow`, `watch`): every change, to every follower (ordered
  consumers); `SharedFeed` (`shared`): every change to one of the replicas sharing a durable
  consumer, acked when handled.

Payloads are opaque bytes; encoding events and views is the typed layer's business.
"""

from dispatch_nats.contract import (
    CONTRACT_VERSION,
    DEFAULT_LAYOUT,
    Layout,
    StreamKind,
    discovery_subject,
    ensure_streams,
    observer_subject,
    record_subject,
    status_subject,
    validate_cluster,
    validate_job_id,
)
from dispatch_nats.errors import (
    AppendOutcomeUnknown,
    ConcurrencyConflict,
    ContractVersionMismatch,
    InvalidName,
    JetStreamApiError,
    JetStreamTemporaryError,
    MsgIdReused,
    NatsStoreError,
    PayloadTooLarge,
    StaleRead,
    StoreUnavailable,
    StreamConfigConflict,
    StreamNotFound,
)
from dispatch_nats.latest import LatestEntry, LatestFeed, LatestStore
from dispatch_nats.record import Appended, RecordChange, RecordEntry, RecordFeed, RecordStore
from dispatch_nats.repository import (
    Change,
    Committed,
    FactAppended,
    Loaded,
    RecordPort,
    RecordRepository,
    StoredEvent,
    TooManyConflicts,
    UnfoldableDecision,
    record_items,
)
from dispatch_nats.shared import Delivery, SharedFeed

__all__ = [
    "CONTRACT_VERSION",
    "DEFAULT_LAYOUT",
    "AppendOutcomeUnknown",
    "Appended",
    "Change",
    "Committed",
    "ConcurrencyConflict",
    "ContractVersionMismatch",
    "Delivery",
    "FactAppended",
    "InvalidName",
    "JetStreamApiError",
    "JetStreamTemporaryError",
    "LatestEntry",
    "LatestFeed",
    "LatestStore",
    "Layout",
    "Loaded",
    "MsgIdReused",
    "NatsStoreError",
    "PayloadTooLarge",
    "RecordChange",
    "RecordEntry",
    "RecordFeed",
    "RecordPort",
    "RecordRepository",
    "RecordStore",
    "SharedFeed",
    "StaleRead",
    "StoreUnavailable",
    "StoredEvent",
    "StreamConfigConflict",
    "StreamKind",
    "StreamNotFound",
    "TooManyConflicts",
    "UnfoldableDecision",
    "discovery_subject",
    "ensure_streams",
    "observer_subject",
    "record_items",
    "record_subject",
    "status_subject",
    "validate_cluster",
    "validate_job_id",
]
