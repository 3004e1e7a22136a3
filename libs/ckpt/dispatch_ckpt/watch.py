"""``watch``: follow the execution folder and publish each new save once it is complete.

Seed 004: a save isn't visible to the next execution until it's published; ``watch``
publishes saves made by frameworks that know nothing of dispatch. It recognises completion
the way each framework marks it:

* Hugging Face Trainer: a folder ``checkpoint-<step>`` once its ``trainer_state.json`` is
  written (the Trainer writes it after the model, optimizer, scheduler and RNG state; a
  half-written one doesn't parse, so it doesn't count);
* PyTorch Distributed Checkpoint (DCP): a folder holding ``.metadata`` (the coordinator
  writes it last, to ``.metadata.tmp`` then renamed);
* Orbax: a step folder holding ``commit_success.txt`` (Orbax's commit file, written last on
  file systems without atomic rename), or whose ``_CHECKPOINT_METADATA`` holds a
  ``commit_timestamp_nsecs`` (set when the save is finalized, before Orbax renames its
  ``<step>.orbax-checkpoint-tmp*`` folder into place). Folders with that temporary suffix are
  never published. (Checked against Orbax's ``path/atomicity.py`` and ``path/step.py``.)
* any folder holding a file named by ``--marker``.

The step is ``checkpoint-<step>``'s number for Hugging Face, otherwise the last number in
the folder's name (``step-500``, ``step_500``, ``500``). A recognised save is not searched
further, so a framework's inner folders are never published on their own.

``watch`` stops at the first error (seed 004, "Limits"): a store error ends it, on POSIX as
on S3, and a scan that doesn't finish within the timeout is one. A save that vanishes before
it is published (deleted by the framework's rotation) is not an error: it can't be resumed
from anyway.
"""

from __future__ import annotations

import enum
import logging
import re
import threading
from collections.abc import Callable, Container
from typing import Final, TypeVar

import msgspec

from dispatch_ckpt.checkpoints import Checkpoints
from dispatch_ckpt.errors import SaveNotFound, ScanTimeout, UnknownStep
from dispatch_ckpt.names import Publication
from dispatch_ckpt.store import Store

__all__ = [
    "DCP_METADATA",
    "HF_TRAINER_STATE",
    "ORBAX_CHECKPOINT_METADATA",
    "ORBAX_COMMIT_FILE",
    "Save",
    "SaveKind",
    "Watcher",
    "find_saves",
]

log = logging.getLogger("dispatch_ckpt.watch")

HF_TRAINER_STATE: Final = "trainer_state.json"
DCP_METADATA: Final = ".metadata"
ORBAX_COMMIT_FILE: Final = "commit_success.txt"
ORBAX_CHECKPOINT_METADATA: Final = "_CHECKPOINT_METADATA"
_ORBAX_TMP: Final = ".orbax-checkpoint-tmp"
_HF_FOLDER: Final = re.compile(r"checkpoint-([0-9]+)")
# Hugging Face Trainer 4.36-4.38 staged saves in tmp-checkpoint-<step> and renamed them.
_HF_STAGING: Final = re.compile(r"tmp-checkpoint-[0-9]+")
_DIGITS: Final = re.compile(r"[0-9]+")

T = TypeVar("T")


class SaveKind(enum.StrEnum):
    """Which completion rule recognised a save."""

    HF = "hf"
    DCP = "dcp"
    ORBAX = "orbax"
    MARKER = "marker"


class Save(msgspec.Struct, frozen=True, kw_only=True):
    """A complete save found in the execution folder."""

    path: str
    """The save's path under the root."""
    step: int
    """The training step, read from the folder's name."""
    kind: SaveKind
    """The rule that recognised it."""


def _json_object(raw: bytes | None) -> dict[str, object] | None:
    if raw is None:
        return None
    try:
        value = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return None  # still being written (or not JSON at all): not complete
    return value if isinstance(value, dict) else None


def _step_from_name(path: str) -> int:
    numbers = _DIGITS.findall(path.rsplit("/", 1)[-1])
    if not numbers:
        raise UnknownStep(path)
    return int(numbers[-1])


def _classify(store: Store, folder: str, files: list[str], marker: str | None) -> Save | bool:
    """Return the save ``folder`` is, ``True`` if it is a save not complete yet (don't look
    inside), or ``False`` if it is no save (look inside)."""
    name = folder.rsplit("/", 1)[-1]
    hf = _HF_FOLDER.fullmatch(name)
    if hf is not None:
        state = (
            _json_object(store.read_bytes(f"{folder}/{HF_TRAINER_STATE}"))
            if HF_TRAINER_STATE in files
            else None
        )
        if state is None:
            return True
        return Save(path=folder, step=int(hf.group(1)), kind=SaveKind.HF)
    if DCP_METADATA in files:
        return Save(path=folder, step=_step_from_name(folder), kind=SaveKind.DCP)
    if ORBAX_COMMIT_FILE in files:
        return Save(path=folder, step=_step_from_name(folder), kind=SaveKind.ORBAX)
    if ORBAX_CHECKPOINT_METADATA in files:
        meta = _json_object(store.read_bytes(f"{folder}/{ORBAX_CHECKPOINT_METADATA}"))
        if meta is None or not meta.get("commit_timestamp_nsecs"):
            return True
        return Save(path=folder, step=_step_from_name(folder), kind=SaveKind.ORBAX)
    if marker is not None and marker in files:
        return Save(path=folder, step=_step_from_name(folder), kind=SaveKind.MARKER)
    return False


def find_saves(
    store: Store, top: str, *, marker: str | None = None, skip: Container[str] = ()
) -> list[Save]:
    """Find the complete saves under the folder ``top`` (a path under the root).

    Args:
        store: the root's store.
        top: the folder to search, e.g. ``exec/<attempt>`` (never a save itself).
        marker: a file name that marks a folder as a complete save (``--marker``).
        skip: paths under the root not to look at (saves already published).

    Returns:
        The complete saves, by step then path.

    Raises:
        UnknownStep: a complete save's folder name holds no number.
        StoreError: the store failed.
    """
    found: list[Save] = []
    for folder, subdirs, files in store.walk(top):
        if folder != top:
            kind = _classify(store, folder, files, marker)
            if kind is not False:
                subdirs.clear()  # a save (complete or not) is not searched further
                if isinstance(kind, Save):
                    found.append(kind)
                continue
        subdirs[:] = [
            d
            for d in subdirs
            if f"{folder}/{d}" not in skip
            and _ORBAX_TMP not in d
            and _HF_STAGING.fullmatch(d) is None
        ]
    return sorted(found, key=lambda s: (s.step, s.path))


def _call_within(fn: Callable[[], T], timeout_s: float, where: str) -> T:
    """Run ``fn`` in a daemon thread and wait at most ``timeout_s`` seconds for it.

    A daemon thread, so that a call stuck in the kernel (a hung NFS mount) or on the network
    can't keep the process from exiting once the timeout is reported.
    """
    box: list[T] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            box.append(fn())
        except BaseException as err:  # handed to the waiting thread below
            failure.append(err)

    worker = threading.Thread(target=run, name="dispatch-ckpt-scan", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        raise ScanTimeout(where, timeout_s)
    if failure:
        raise failure[0]
    return box[0]


class Watcher:
    """Publish each new complete save of this execution (seed 004, ``watch``).

    ``scan()`` does one pass; ``run(stop)`` passes every ``interval_s`` until ``stop`` is set,
    then does a last pass so that a save finished just before the job script stops ``watch``
    is published too. Both raise at the first error (the CLI then exits non-zero).
    """

    def __init__(
        self,
        ckpt: Checkpoints,
        *,
        marker: str | None = None,
        timeout_s: float = 300.0,
        interval_s: float = 5.0,
        on_publish: Callable[[Publication], None] | None = None,
    ) -> None:
        """Prepare to watch ``ckpt``'s execution folder.

        Args:
            ckpt: the root, opened with the execution's attempt and epoch.
            marker: a file name that marks a folder as a complete save.
            timeout_s: the longest one pass (scan and publications) may take, in seconds.
            interval_s: the pause between passes, in seconds.
            on_publish: called with each publication made.
        """
        self._ckpt = ckpt
        self._marker = marker
        self._timeout_s = timeout_s
        self._interval_s = interval_s
        self._on_publish = on_publish
        self._published: set[str] | None = None

    def _already_published(self, top: str) -> set[str]:
        # Publications of this execution's folder made before this watch started (a watch
        # restarted in the same execution): they are not published again.
        inside = f"{top}/"
        return {p.path for p in self._ckpt.publications() if p.path.startswith(inside)}

    def _pass(self) -> list[Publication]:
        top = self._ckpt.exec_relpath()
        store = self._ckpt.store
        if self._published is None:
            store.make_dir(top)
            self._published = self._already_published(top)
        published = self._published
        made: list[Publication] = []
        for save in find_saves(store, top, marker=self._marker, skip=published):
            if save.path in published:
                continue
            try:
                pub = self._ckpt.publish_relpath(save.step, save.path)
            except SaveNotFound:
                log.warning("save vanished before it was published: %s", save.path)
                continue
            published.add(save.path)
            made.append(pub)
            if self._on_publish is not None:
                self._on_publish(pub)
        return made

    def scan(self) -> list[Publication]:
        """Do one pass: find complete saves and publish the new ones, within the timeout.

        Returns:
            The publications made, by step.

        Raises:
            ScanTimeout: the pass didn't finish within ``timeout_s``.
            CkptError: any other error (a store error, a malformed entry, a save whose
                name holds no step, a publication that already exists).
        """
        where = self._ckpt.store.location(self._ckpt.exec_relpath())
        return _call_within(self._pass, self._timeout_s, where)

    def run(self, stop: threading.Event) -> None:
        """Pass every ``interval_s`` seconds until ``stop`` is set, then pass once more.

        Raises:
            CkptError: the first error; nothing after it is published.
        """
        while True:
            self.scan()
            if stop.wait(self._interval_s):
                self.scan()
                return
