"""dispatch_core: the pure core of dispatch (placeholder; the public API is being built)."""

from dispatch_core.epoch import MAX_EPOCH, MAX_GENERATION, EpochParts, epoch, split_epoch
from dispatch_core.errors import DispatchError, EpochOutOfRange

__all__ = [
    "MAX_EPOCH",
    "MAX_GENERATION",
    "DispatchError",
    "EpochOutOfRange",
    "EpochParts",
    "epoch",
    "split_epoch",
]
