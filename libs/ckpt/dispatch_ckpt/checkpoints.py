"""The checkpoint root as one execution sees it: its folder, publish, latest (seed 004).

Use:

    ckpt = Checkpoints.open("/lustre/ckpt/job-7", os.environ)   # or "s3://bucket/job-7"
    out = ckpt.exec_dir()                     # <root>/exec/<DISPATCH_ATTEMPT>, created
    ...the framework saves into out/step-500...
    ckpt.publish(500, f"{out}/step-500")      # <root>/pub/<epoch>-<step>-<base32 path>
    pub = ckpt.latest()                       # greatest (epoch, step), or None
    ckpt.location(pub)                        # where to resume from

Reading needs no identity; writing needs the execution's (see :class:`Checkpoints`).
"""

from __future__ import annotations

from collections.abc import Mapping

from dispatch_ckpt.env import ExecutionEnv
from dispatch_ckpt.errors import InvalidPath, SaveNotFound
from dispatch_ckpt.names import Publication, encode_name, latest, parse_name, sort_key
from dispatch_ckpt.store import EXEC_DIR, PUB_DIR, Listing, Store, open_store

__all__ = ["Checkpoints"]


class Checkpoints:
    """A checkpoint root and the identity of the execution using it (seed 004).

    Reading (``latest``, ``publications``) needs no identity. Writing needs it: the
    execution folder needs ``DISPATCH_ATTEMPT``, and publishing needs ``DISPATCH_ATTEMPT``
    and ``DISPATCH_EPOCH`` ("refusing to publish without them unless given explicitly").
    """

    def __init__(self, store: Store, env: ExecutionEnv | None = None) -> None:
        """Use ``store`` as the root, as the execution ``env`` (none: read-only use)."""
        self._store = store
        self._env = env if env is not None else ExecutionEnv()

    @classmethod
    def open(
        cls,
        root: str,
        environ: Mapping[str, str] | None = None,
        *,
        attempt: str | None = None,
        epoch: int | str | None = None,
        timeout_s: float | None = None,
    ) -> Checkpoints:
        """Open a root (a path or ``s3://bucket/prefix``) for the execution in ``environ``.

        Args:
            root: the checkpoint root.
            environ: where to read ``DISPATCH_ATTEMPT`` / ``DISPATCH_EPOCH`` (the caller
                passes ``os.environ``; ``None`` reads nothing).
            attempt: the attempt token, overriding ``DISPATCH_ATTEMPT``.
            epoch: the epoch, overriding ``DISPATCH_EPOCH``.
            timeout_s: on S3, the longest one request may take, in seconds.

        Raises:
            InvalidRoot: the root is not a path or an ``s3://`` URL.
            InvalidEnvironment: the attempt or epoch is present but unusable (an epoch
                outside the core's bounds, an attempt that can't name a folder).
        """
        env = ExecutionEnv.from_env(environ or {}, attempt=attempt, epoch=epoch)
        return cls(open_store(root, timeout_s=timeout_s), env)

    @property
    def store(self) -> Store:
        """The store holding the root."""
        return self._store

    @property
    def env(self) -> ExecutionEnv:
        """The execution's identity (either part may be ``None``)."""
        return self._env

    @property
    def root(self) -> str:
        """The root: an absolute path or ``s3://bucket/prefix``."""
        return self._store.root

    def exec_relpath(self) -> str:
        """Return ``exec/<DISPATCH_ATTEMPT>``, the execution folder's path under the root.

        Raises:
            MissingEnvironment: no attempt token.
        """
        return f"{EXEC_DIR}/{self._env.require_attempt('the execution folder')}"

    def exec_dir(self) -> str:
        """Return the execution folder ``<root>/exec/<DISPATCH_ATTEMPT>``, created if missing
        (seed 004, "Each execution writes into its own folder").

        Nothing but this execution writes there, so its saves can't be resumed from or
        rotated away by another execution, an old one still running included.

        Raises:
            MissingEnvironment: no attempt token.
            StoreError: the folder can't be created.
        """
        return self._store.make_dir(self.exec_relpath())

    def publish(self, step: int, path: str) -> Publication:
        """Publish the save at ``path`` as this execution's save of ``step`` (seed 004).

        Creates the empty entry ``<root>/pub/<epoch:020d>-<step:020d>-<base32(path under
        the root)>`` exclusively; it is durable when this returns. It is never renamed,
        rewritten or appended to.

        Args:
            step: the training step, 0..10**20-1.
            path: the save's full location (a path, or an ``s3://`` URL), inside the root.

        Returns:
            The publication.

        Raises:
            MissingEnvironment: ``DISPATCH_ATTEMPT`` or ``DISPATCH_EPOCH`` missing.
            InvalidPath: ``path`` is outside the root, is the root, or is inside ``pub/``.
            SaveNotFound: nothing is at ``path``.
            InvalidStep, NameTooLong: the name can't be made.
            AlreadyPublished: the name exists already (an error, never a silent success).
            StoreError: the store failed.
        """
        return self.publish_relpath(step, self._store.relpath(path))

    def publish_relpath(self, step: int, relpath: str) -> Publication:
        """Publish the save at ``relpath`` (a path under the root); see :meth:`publish`."""
        epoch = self._env.require_epoch("publish")
        self._env.require_attempt("publish")
        if relpath == PUB_DIR or relpath.startswith(f"{PUB_DIR}/"):
            raise InvalidPath(relpath, self.root, "expected a save, found a path inside pub/")
        name = encode_name(epoch, step, relpath)
        if not self._store.exists(relpath):
            raise SaveNotFound(self._store.location(relpath))
        self._store.create_entry(name)
        return Publication(epoch=epoch, step=step, path=relpath)

    def listing(self) -> Listing:
        """List ``pub/`` (every page on S3).

        Raises:
            StoreError: the store failed.
        """
        return self._store.list_entries()

    def latest(self) -> Publication | None:
        """Return the publication with the greatest epoch, then step (seed 004).

        Found by listing ``pub/`` (every page on S3); no lock and no pointer. An old
        execution's late publication carries its lower epoch, so it never outranks a
        replacement's saves, however high its step.

        Returns:
            The latest publication, or ``None`` when nothing is published.

        Raises:
            MalformedName: an entry that could be the latest doesn't parse (never skipped).
            StoreError: the store failed.
        """
        return latest(self._store.list_entries().names)

    def publications(self) -> list[Publication]:
        """Return every publication, oldest first (by epoch, then step).

        Raises:
            MalformedName: an entry doesn't parse.
            StoreError: the store failed.
        """
        pubs = [parse_name(name) for name in self._store.list_entries().names]
        return sorted(pubs, key=sort_key)

    def location(self, pub: Publication) -> str:
        """Return the full location (path or ``s3://`` URL) of a publication's save."""
        return self._store.location(pub.path)
