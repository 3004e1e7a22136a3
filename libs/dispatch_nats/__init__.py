"""dispatch_nats: dispatch's NATS contract and JetStream stores.

* `contract`: stream layout and subject names (the public, versioned contract), subject
  builders and `ensure_streams`.
* `RecordStore`: each job's append-only record, with optimistic concurrency and idempotent,
  outcome-resolving appends; reads, listing, and following appends across all jobs.
* `LatestStore`: latest value per subject for the discovery and status streams.

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
    InvalidName,
    JetStreamApiError,
    JetStreamTemporaryError,
    MsgIdReused,
    NatsStoreError,
    PayloadTooLarge,
    StoreUnavailable,
    StreamConfigConflict,
    StreamNotFound,
)
from dispatch_nats.latest import LatestEntry, LatestFeed, LatestStore
from dispatch_nats.record import RecordChange, RecordEntry, RecordFeed, RecordStore

__all__ = [
    "CONTRACT_VERSION",
    "DEFAULT_LAYOUT",
    "AppendOutcomeUnknown",
    "ConcurrencyConflict",
    "InvalidName",
    "JetStreamApiError",
    "JetStreamTemporaryError",
    "LatestEntry",
    "LatestFeed",
    "LatestStore",
    "Layout",
    "MsgIdReused",
    "NatsStoreError",
    "PayloadTooLarge",
    "RecordChange",
    "RecordEntry",
    "RecordFeed",
    "RecordStore",
    "StoreUnavailable",
    "StreamConfigConflict",
    "StreamKind",
    "StreamNotFound",
    "discovery_subject",
    "ensure_streams",
    "observer_subject",
    "record_subject",
    "status_subject",
    "validate_cluster",
    "validate_job_id",
]
