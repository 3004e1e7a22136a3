"""dispatch_ckpt: isolated checkpoints and append-only publication (seed 004).

Used inside the training job. Each execution saves into its own folder,
``<root>/exec/<DISPATCH_ATTEMPT>/``; a save becomes visible to later executions when it is
published as an empty entry ``<root>/pub/<epoch:020d>-<step:020d>-<base32 path>``, created
exclusively; the latest checkpoint is the entry with the greatest epoch, then step. The root
is a path or an ``s3://bucket/prefix`` URL.

    from dispatch_ckpt import Checkpoints
    ckpt = Checkpoints.open(root, os.environ)
    ckpt.publish(500, f"{ckpt.exec_dir()}/step-500")
    pub = ckpt.latest()

Framework integrations (imported on demand, so the core install needs no framework):
``dispatch_ckpt.integrations.hf``, ``.lightning``, ``.torch``.
"""

from dispatch_ckpt.checkpoints import Checkpoints
from dispatch_ckpt.env import ATTEMPT_VAR, EPOCH_VAR, ExecutionEnv
from dispatch_ckpt.errors import (
    AlreadyPublished,
    CkptError,
    IncompatibleSave,
    InvalidEnvironment,
    InvalidPath,
    InvalidRoot,
    InvalidStep,
    MalformedName,
    MissingEnvironment,
    NameTooLong,
    SaveNotFound,
    ScanTimeout,
    StoreError,
    UnknownStep,
)
from dispatch_ckpt.names import Publication, encode_name, parse_name
from dispatch_ckpt.store import Listing, Store, open_store
from dispatch_ckpt.watch import Save, SaveKind, Watcher, find_saves

__all__ = [
    "ATTEMPT_VAR",
    "EPOCH_VAR",
    "AlreadyPublished",
    "Checkpoints",
    "CkptError",
    "ExecutionEnv",
    "IncompatibleSave",
    "InvalidEnvironment",
    "InvalidPath",
    "InvalidRoot",
    "InvalidStep",
    "Listing",
    "MalformedName",
    "MissingEnvironment",
    "NameTooLong",
    "Publication",
    "Save",
    "SaveKind",
    "SaveNotFound",
    "ScanTimeout",
    "Store",
    "StoreError",
    "UnknownStep",
    "Watcher",
    "encode_name",
    "find_saves",
    "open_store",
    "parse_name",
]
