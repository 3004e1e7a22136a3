"""Where a checkpoint root lives: the :class:`Store` protocol and :func:`open_store`.

A root is a path (:class:`dispatch_ckpt.posix.PosixStore`) or an ``s3://bucket/prefix`` URL
(:class:`dispatch_ckpt.s3.S3Store`, the only module that imports boto3; it is imported only
when an S3 root is opened). Both give the same operations on paths *under the root*
(``/``-separated, relative; see :func:`dispatch_ckpt.names.check_relpath`), so publication,
``latest`` and ``watch`` are written once.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Final, Protocol

import msgspec

from dispatch_ckpt.errors import InvalidRoot

__all__ = ["EXEC_DIR", "PUB_DIR", "Listing", "Store", "WalkEntry", "open_store"]

#: The folder of the executions' private folders, ``<root>/exec/<attempt>/`` (seed 004).
EXEC_DIR: Final = "exec"
#: The folder of publications, ``<root>/pub/`` (seed 004).
PUB_DIR: Final = "pub"

_SCHEME: Final = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")

#: One folder seen by :meth:`Store.walk`: its path under the root, its sub-folders' names
#: (a list the caller may shrink to prune the walk, as with ``os.walk``) and its files' names.
WalkEntry = tuple[str, list[str], list[str]]


class Listing(msgspec.Struct, frozen=True, kw_only=True):
    """The entries of ``pub/``, as one listing found them."""

    names: list[str]
    """Every entry's name, in the store's order (unsorted)."""
    pages: int
    """How many list requests it took (S3 returns at most 1,000 keys a page; POSIX: 1)."""


class Store(Protocol):
    """The operations publication, ``latest`` and ``watch`` need from a root (seed 004)."""

    @property
    def root(self) -> str:
        """The root as a user writes it: an absolute path or ``s3://bucket/prefix``."""
        ...

    def location(self, relpath: str) -> str:
        """Return the full location (path or URL) of ``relpath`` under the root."""
        ...

    def relpath(self, location: str) -> str:
        """Return the path under the root of a full location; the inverse of `location`.

        Raises:
            InvalidPath: the location is not under the root.
        """
        ...

    def make_dir(self, relpath: str) -> str:
        """Create the folder ``relpath`` if it is missing and return its location.

        On S3 folders don't exist apart from their objects, so nothing is created.
        """
        ...

    def exists(self, relpath: str) -> bool:
        """Whether a file or a non-empty folder is at ``relpath``."""
        ...

    def create_entry(self, name: str) -> None:
        """Create the empty entry ``pub/<name>`` exclusively and durably (seed 004).

        POSIX: ``O_CREAT|O_EXCL``, then fsync of ``pub/`` and of the root before returning.
        S3: a conditional create, ``If-None-Match: *``.

        Raises:
            AlreadyPublished: the entry exists (whoever created it).
            StoreError: the store failed.
        """
        ...

    def list_entries(self) -> Listing:
        """List every entry of ``pub/`` (every page on S3).

        Raises:
            StoreError: the store failed.
        """
        ...

    def walk(self, relpath: str) -> Iterator[WalkEntry]:
        """Walk the folder ``relpath`` top-down, like ``os.walk``.

        Each item is (folder under the root, sub-folder names, file names); removing names
        from the sub-folder list prunes them. A folder that vanishes during the walk is left
        out (a framework's rotation may delete old saves at any time).

        Raises:
            StoreError: the store failed.
        """
        ...

    def read_bytes(self, relpath: str) -> bytes | None:
        """Return the file's content, or ``None`` when there is no such file.

        Raises:
            StoreError: the store failed.
        """
        ...

    def write_bytes(self, relpath: str, data: bytes) -> None:
        """Write a file durably (POSIX: written, fsynced, then renamed into place).

        Raises:
            StoreError: the store failed.
        """
        ...


def open_store(root: str, *, timeout_s: float | None = None) -> Store:
    """Open a checkpoint root given as a path or an ``s3://bucket[/prefix]`` URL.

    S3 takes its endpoint URL, region and credentials from the usual boto3 configuration
    (``AWS_ENDPOINT_URL``, ``AWS_DEFAULT_REGION``, ``AWS_ACCESS_KEY_ID``, ``~/.aws/config``,
    ...).

    Args:
        root: the checkpoint root.
        timeout_s: on S3, the longest one request may take to connect or to answer, in
            seconds (botocore's default when ``None``).

    Raises:
        InvalidRoot: the root is empty, uses another scheme, or names no bucket; or it is an
            S3 root and boto3 is not installed (``dispatch-ckpt[s3]`` installs it).
    """
    if not root:
        raise InvalidRoot(root, "expected a path or an s3://bucket/prefix URL, found nothing")
    if root.startswith("s3://"):
        # boto3 is optional: a training image with POSIX roots only does without it.
        try:
            from dispatch_ckpt.s3 import S3Store
        except ModuleNotFoundError as err:
            if err.name not in ("boto3", "botocore"):
                raise
            raise InvalidRoot(
                root, "s3:// roots need boto3: pip install 'dispatch-ckpt[s3]' (or boto3)"
            ) from err

        return S3Store.from_url(root, timeout_s=timeout_s)
    if _SCHEME.match(root):
        raise InvalidRoot(root, "expected a path or an s3:// URL, found another scheme")
    from dispatch_ckpt.posix import PosixStore

    return PosixStore(root)
