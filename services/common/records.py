"""Reading a job's record as ``fold`` takes it: kept for the supervisor's pass until it
loads through ``dispatch_nats.RecordRepository`` (which defines ``record_items``)."""

from __future__ import annotations

from dispatch_nats.repository import record_items

__all__ = ["record_items"]
