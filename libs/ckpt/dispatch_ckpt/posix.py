"""A checkpoint root on a POSIX file system (local disk, Lustre, NFS, GPFS).

Publication is ``open(O_CREAT|O_EXCL)`` of an empty file, then fsync of ``pub/`` and of the
root (seed 004, "Publication is append-only"): the kernel (or the file server) lets exactly
one creator win, with no lock and no check-then-rename, which matters because locks are
unreliable on Lustre, NFS and GPFS.
"""

from __future__ import annotations

import contextlib
import errno
import os
import uuid
from collections.abc import Iterator
from typing import Final

from dispatch_ckpt.errors import AlreadyPublished, InvalidPath, StoreError
from dispatch_ckpt.names import check_relpath
from dispatch_ckpt.store import PUB_DIR, Listing, WalkEntry

__all__ = ["PosixStore"]

_CREATE_FLAGS: Final = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
_ENTRY_MODE: Final = 0o644


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class PosixStore:
    """A root that is a folder; see :class:`dispatch_ckpt.store.Store` for the contract."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        """Open the root folder ``root`` (it is created by the first publication or save).

        The root is resolved once (symbolic links followed), so that a save's path under
        the root is the same however it is spelled.
        """
        self._root = os.path.realpath(os.fspath(root))
        self._pub = os.path.join(self._root, PUB_DIR)

    @property
    def root(self) -> str:
        """The root's absolute, resolved path."""
        return self._root

    def location(self, relpath: str) -> str:
        """Return the absolute path of ``relpath`` under the root."""
        return os.path.join(self._root, *relpath.split("/"))

    def relpath(self, location: str) -> str:
        """Return ``location``'s path under the root, ``/``-separated.

        Raises:
            InvalidPath: it is the root itself or outside it (after resolving links).
        """
        real = os.path.realpath(location)
        rel = os.path.relpath(real, self._root)
        if rel == os.curdir or rel == os.pardir or rel.startswith(os.pardir + os.sep):
            raise InvalidPath(location, self._root, "expected a path inside the root")
        rel = rel.replace(os.sep, "/")
        problem = check_relpath(rel)
        if problem is not None:
            raise InvalidPath(location, self._root, problem)
        return rel

    def make_dir(self, relpath: str) -> str:
        """Create the folder (and its parents) if missing; return its absolute path.

        Raises:
            StoreError: it can't be created.
        """
        path = self.location(relpath)
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as err:
            raise StoreError("create folder", path, str(err)) from err
        return path

    def exists(self, relpath: str) -> bool:
        """Whether a file or folder is at ``relpath``."""
        return os.path.lexists(self.location(relpath))

    def create_entry(self, name: str) -> None:
        """Create ``pub/<name>`` with ``O_CREAT|O_EXCL``, then fsync it, ``pub/`` and the root.

        Raises:
            AlreadyPublished: the entry exists.
            StoreError: any other failure (the entry may or may not exist then).
        """
        path = os.path.join(self._pub, name)
        try:
            # Apart from the exclusive create: makedirs raises FileExistsError when pub/ is a
            # file, which is a broken root, not a lost race.
            os.makedirs(self._pub, exist_ok=True)
        except OSError as err:
            raise StoreError("create entry", path, f"can't create pub/: {err}") from err
        try:
            fd = os.open(path, _CREATE_FLAGS, _ENTRY_MODE)
        except FileExistsError as err:
            raise AlreadyPublished(name, path) from err
        except OSError as err:
            if err.errno == errno.ELOOP:  # O_NOFOLLOW met a symbolic link: a name taken
                raise AlreadyPublished(name, path) from err
            raise StoreError("create entry", path, str(err)) from err
        try:
            os.fsync(fd)
            os.close(fd)
            # The entry's name lives in pub/, and pub/'s name in the root: sync both so a
            # returned publication survives a crash (seed 004).
            _fsync_dir(self._pub)
            _fsync_dir(self._root)
        except OSError as err:
            raise StoreError("sync entry", path, str(err)) from err

    def list_entries(self) -> Listing:
        """List ``pub/`` (an absent ``pub/`` has no entries).

        Raises:
            StoreError: ``pub/`` can't be read.
        """
        try:
            names = os.listdir(self._pub)
        except FileNotFoundError:
            names = []
        except OSError as err:
            raise StoreError("list", self._pub, str(err)) from err
        return Listing(names=names, pages=1)

    def walk(self, relpath: str) -> Iterator[WalkEntry]:
        """Walk ``relpath`` top-down; a folder that vanishes meanwhile is left out.

        Raises:
            StoreError: a folder can't be read for another reason.
        """
        top = self.location(relpath)

        def on_error(err: OSError) -> None:
            if isinstance(err, FileNotFoundError) and err.filename != top:
                return  # deleted during the walk (a framework's rotation): not a failure
            raise StoreError("scan", str(err.filename or top), str(err)) from err

        prefix_len = len(self._root) + 1
        for dirpath, dirnames, filenames in os.walk(top, onerror=on_error):
            yield dirpath[prefix_len:].replace(os.sep, "/"), dirnames, filenames

    def read_bytes(self, relpath: str) -> bytes | None:
        """Return the file's content, or ``None`` when it is missing.

        Raises:
            StoreError: it can't be read for another reason.
        """
        path = self.location(relpath)
        try:
            with open(path, "rb") as f:
                return f.read()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None
        except OSError as err:
            raise StoreError("read", path, str(err)) from err

    def write_bytes(self, relpath: str, data: bytes) -> None:
        """Write the file: to a temporary name, fsync, rename into place, fsync the folder.

        Raises:
            StoreError: it can't be written.
        """
        path = self.location(relpath)
        folder = os.path.dirname(path)
        tmp = f"{path}.tmp-{os.getpid()}-{uuid.uuid4().hex}"
        try:
            os.makedirs(folder, exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            _fsync_dir(folder)
        except OSError as err:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise StoreError("write", path, str(err)) from err
