"""A checkpoint root in S3 (``s3://bucket/prefix``): the only module that imports boto3.

Publication is a conditional create, ``PutObject`` with ``If-None-Match: *`` (seed 004): the
server lets exactly one writer create the key, and answers every other with 412. The
endpoint URL, region and credentials come from the usual boto3 configuration
(``AWS_ENDPOINT_URL``, ``AWS_DEFAULT_REGION``, ``AWS_ACCESS_KEY_ID``, ``~/.aws/config``).

A request whose answer is lost and that botocore retries may find its own first try already
landed, and get 412 for it. So each create carries a random ``x-amz-meta-dispatch-writer``
token, and a 412 is a loss only when the entry holds another writer's token. The entry's
body stays empty (seed 004: "an empty file").
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Final

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from dispatch_ckpt.errors import AlreadyPublished, InvalidPath, InvalidRoot, StoreError
from dispatch_ckpt.names import check_relpath
from dispatch_ckpt.store import PUB_DIR, Listing, WalkEntry

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

__all__ = ["S3Store", "parse_s3_url"]

#: User metadata naming the writer of an entry (sent as ``x-amz-meta-dispatch-writer``).
WRITER_META: Final = "dispatch-writer"
#: How often a create is tried again after 409 ConditionalRequestConflict (AWS answers it
#: when conditional writes of one key race; one of them wins, the others then get 412).
_CONFLICT_RETRIES: Final = 5
_NOT_FOUND: Final = frozenset({"404", "NoSuchKey", "NotFound"})
_PRECONDITION_FAILED: Final = frozenset({"412", "PreconditionFailed"})
_CONFLICT: Final = frozenset({"409", "ConditionalRequestConflict"})


def parse_s3_url(url: str) -> tuple[str, str]:
    """Split ``s3://bucket[/prefix]`` into (bucket, prefix without trailing ``/``).

    Raises:
        InvalidRoot: no bucket, or a prefix with empty, ``.`` or ``..`` components.
    """
    rest = url.removeprefix("s3://")
    bucket, _, prefix = rest.partition("/")
    prefix = prefix.rstrip("/")
    if not bucket:
        raise InvalidRoot(url, "expected s3://bucket[/prefix], found no bucket")
    if prefix:
        problem = check_relpath(prefix)
        if problem is not None:
            raise InvalidRoot(url, f"prefix {prefix!r}: {problem}")
    return bucket, prefix


def _error_code(err: ClientError) -> str:
    return str(err.response.get("Error", {}).get("Code", ""))


def _status(err: ClientError) -> str:
    return str(err.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))


def _is(err: ClientError, codes: frozenset[str]) -> bool:
    return _error_code(err) in codes or _status(err) in codes


class S3Store:
    """A root in an S3 bucket; see :class:`dispatch_ckpt.store.Store` for the contract."""

    def __init__(self, client: S3Client, bucket: str, prefix: str = "") -> None:
        """Use ``client`` for the root ``s3://<bucket>/<prefix>``.

        Args:
            client: a boto3 S3 client.
            bucket: the bucket.
            prefix: the key prefix of the root, without leading or trailing ``/``.
        """
        self._client = client
        self._bucket = bucket
        self._prefix = prefix
        self._key_prefix = f"{prefix}/" if prefix else ""

    @classmethod
    def from_url(cls, url: str, *, timeout_s: float | None = None) -> S3Store:
        """Open ``s3://bucket[/prefix]`` with a client from the usual boto3 configuration.

        Args:
            url: the root.
            timeout_s: the longest one request may take to connect or to answer, in seconds.

        Raises:
            InvalidRoot: the URL names no bucket or has a malformed prefix.
            StoreError: boto3 can't make a client (e.g. an unknown profile).
        """
        bucket, prefix = parse_s3_url(url)
        options: dict[str, Any] = {}
        if timeout_s is not None:
            options.update(connect_timeout=timeout_s, read_timeout=timeout_s)
        try:
            client: S3Client = boto3.session.Session().client("s3", config=Config(**options))
        except BotoCoreError as err:
            raise StoreError("open", url, str(err)) from err
        return cls(client, bucket, prefix)

    @property
    def root(self) -> str:
        """``s3://bucket/prefix`` (``s3://bucket`` for a whole bucket)."""
        return f"s3://{self._bucket}/{self._prefix}" if self._prefix else f"s3://{self._bucket}"

    @property
    def bucket(self) -> str:
        """The bucket."""
        return self._bucket

    def key(self, relpath: str) -> str:
        """Return the object key of ``relpath`` under the root."""
        return self._key_prefix + relpath

    def location(self, relpath: str) -> str:
        """Return ``s3://bucket/<prefix>/<relpath>``."""
        return f"s3://{self._bucket}/{self.key(relpath)}"

    def relpath(self, location: str) -> str:
        """Return the path under the root of an ``s3://`` URL inside it.

        Raises:
            InvalidPath: not an ``s3://`` URL of this bucket under the prefix.
        """
        base = f"s3://{self._bucket}/{self._key_prefix}"
        if not location.startswith(base):
            raise InvalidPath(location, self.root, f"expected an s3:// URL starting with {base}")
        rel = location[len(base) :].rstrip("/")
        problem = check_relpath(rel)
        if problem is not None:
            raise InvalidPath(location, self.root, problem)
        return rel

    def make_dir(self, relpath: str) -> str:
        """Return the folder's URL; S3 has no folders to create."""
        return self.location(relpath)

    def _fail(self, operation: str, key: str, err: Exception) -> StoreError:
        return StoreError(operation, f"s3://{self._bucket}/{key}", str(err))

    def exists(self, relpath: str) -> bool:
        """Whether an object is at ``relpath`` or under ``relpath/``.

        Raises:
            StoreError: S3 failed.
        """
        key = self.key(relpath)
        try:
            # A file answers the HEAD (one request); a folder needs the LIST as well.
            self._client.head_object(Bucket=self._bucket, Key=key)
            return True
        except ClientError as err:
            if not _is(err, _NOT_FOUND):
                raise self._fail("look up", key, err) from err
        except BotoCoreError as err:
            raise self._fail("look up", key, err) from err
        try:
            listed = self._client.list_objects_v2(Bucket=self._bucket, Prefix=key + "/", MaxKeys=1)
        except (ClientError, BotoCoreError) as err:
            raise self._fail("look up", key, err) from err
        return listed.get("KeyCount", 0) > 0

    def create_entry(self, name: str) -> None:
        """Create the empty object ``pub/<name>`` with ``If-None-Match: *``.

        Raises:
            AlreadyPublished: the key exists and another writer created it.
            StoreError: S3 failed (the entry may or may not exist then).
        """
        key = self.key(f"{PUB_DIR}/{name}")
        token = uuid.uuid4().hex
        for attempt in range(_CONFLICT_RETRIES + 1):
            try:
                self._client.put_object(
                    Bucket=self._bucket,
                    Key=key,
                    Body=b"",
                    IfNoneMatch="*",
                    Metadata={WRITER_META: token},
                )
                return
            except ClientError as err:
                if _is(err, _PRECONDITION_FAILED):
                    if self._writer(key) == token:
                        return  # our own earlier try landed; its answer was lost
                    raise AlreadyPublished(name, f"s3://{self._bucket}/{key}") from err
                if _is(err, _CONFLICT) and attempt < _CONFLICT_RETRIES:
                    time.sleep(0.05 * (attempt + 1))
                    continue
                raise self._fail("create entry", key, err) from err
            except BotoCoreError as err:
                raise self._fail("create entry", key, err) from err
        raise AssertionError("unreachable: the loop returns or raises")  # pragma: no cover

    def _writer(self, key: str) -> str | None:
        try:
            head = self._client.head_object(Bucket=self._bucket, Key=key)
        except ClientError as err:
            raise self._fail("read entry", key, err) from err
        except BotoCoreError as err:
            raise self._fail("read entry", key, err) from err
        return head.get("Metadata", {}).get(WRITER_META)

    def _keys(self, prefix: str, operation: str) -> tuple[list[str], int]:
        keys: list[str] = []
        pages = 0
        try:
            paginator = self._client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self._bucket, Prefix=prefix):
                pages += 1
                keys.extend(obj["Key"] for obj in page.get("Contents", []))
        except (ClientError, BotoCoreError) as err:
            raise self._fail(operation, prefix, err) from err
        return keys, pages

    def list_entries(self) -> Listing:
        """List every key under ``pub/``, following every page.

        Raises:
            StoreError: S3 failed.
        """
        prefix = self.key(f"{PUB_DIR}/")
        keys, pages = self._keys(prefix, "list")
        start = len(prefix)
        # The folder marker some tools write ("pub/" itself) is the folder, not an entry.
        return Listing(names=[k[start:] for k in keys if k != prefix], pages=pages)

    def walk(self, relpath: str) -> Iterator[WalkEntry]:
        """Walk ``relpath`` top-down from one listing of every key under it.

        Raises:
            StoreError: S3 failed.
        """
        prefix = self.key(relpath) + "/"
        keys, _ = self._keys(prefix, "scan")
        # folder (path under the root) -> (sub-folder names, file names)
        tree: dict[str, tuple[dict[str, None], list[str]]] = {relpath: ({}, [])}
        for key in keys:
            parts = key[len(prefix) :].split("/")
            folder = relpath
            for part in parts[:-1]:
                if not part:
                    break  # "a//b": not a path this helper writes or reads
                tree[folder][0].setdefault(part, None)
                folder = f"{folder}/{part}"
                tree.setdefault(folder, ({}, []))
            else:
                if parts[-1]:  # a key ending in "/" is a folder marker, not a file
                    tree[folder][1].append(parts[-1])
        stack = [relpath]
        while stack:
            folder = stack.pop()
            subdirs, files = tree[folder]
            names = sorted(subdirs)
            yield folder, names, sorted(files)
            stack.extend(f"{folder}/{name}" for name in reversed(names))

    def read_bytes(self, relpath: str) -> bytes | None:
        """Return the object's body, or ``None`` when there is no such object.

        Raises:
            StoreError: S3 failed.
        """
        key = self.key(relpath)
        try:
            return self._client.get_object(Bucket=self._bucket, Key=key)["Body"].read()
        except ClientError as err:
            if _is(err, _NOT_FOUND):
                return None
            raise self._fail("read", key, err) from err
        except BotoCoreError as err:
            raise self._fail("read", key, err) from err

    def write_bytes(self, relpath: str, data: bytes) -> None:
        """Put the object (a PUT is atomic: readers see all of it or nothing).

        Raises:
            StoreError: S3 failed.
        """
        key = self.key(relpath)
        try:
            self._client.put_object(Bucket=self._bucket, Key=key, Body=data)
        except (ClientError, BotoCoreError) as err:
            raise self._fail("write", key, err) from err
