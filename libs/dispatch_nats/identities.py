"""NATS identities on disk: one nkey user seed per identity (public).

A site's identities live in one directory, one file per identity::

    api.nk  supervisor.nk  notifier.nk  observer-<cluster>.nk  reader.nk

Each file holds the nkey *seed* (``SU...``, the secret, mode 0600) that the service passes to
nats-py (``<SVC>_NATS_NKEY_SEED_FILE``); the server's configuration holds only the public key
(``U...``), so the configuration itself is no secret. A seed is made once and reused: running
the generator again keeps existing seeds (rotate one by deleting its file and generating
again, then reloading the servers: see deploy/nats/README.md). A ``<identity>.creds`` file
(a JWT and seed, for sites whose NATS uses decentralised JWT authentication) is used instead
of the ``.nk`` file when present; dispatch does not make those.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterable
from pathlib import Path
from typing import Final

import nkeys

from dispatch_nats.errors import NatsStoreError
from dispatch_nats.permissions import Identity

__all__ = [
    "CREDS_SUFFIX",
    "SEED_SUFFIX",
    "IdentityError",
    "creds_path",
    "load_or_make_seed",
    "make_identities",
    "public_key",
    "read_public_key",
    "seed_path",
]

SEED_SUFFIX: Final = ".nk"
CREDS_SUFFIX: Final = ".creds"


class IdentityError(NatsStoreError):
    """An identity's file can't be read, written, or does not hold a user nkey seed."""


def seed_path(directory: Path, identity: Identity) -> Path:
    """``<directory>/<identity>.nk``."""
    return directory / f"{identity.name}{SEED_SUFFIX}"


def creds_path(directory: Path, identity: Identity) -> Path:
    """``<directory>/<identity>.creds``."""
    return directory / f"{identity.name}{CREDS_SUFFIX}"


def public_key(seed: bytes) -> str:
    """The public user nkey (``U...``) of a seed (``SU...``).

    Raises:
        IdentityError: ``seed`` is not a user nkey seed.
    """
    try:
        kp = nkeys.from_seed(bytearray(seed.strip()))
        key = str(kp.public_key.decode())
    except (nkeys.NkeysError, ValueError) as err:
        raise IdentityError("not an nkey seed") from err
    if not key.startswith("U"):
        raise IdentityError("not a user nkey seed (it must start with SU)")
    return key


def read_public_key(path: Path) -> str:
    """The public key of the seed kept in ``path``.

    Raises:
        IdentityError: it can't be read or holds no user seed (the message names the file,
            never its content).
    """
    try:
        seed = path.read_bytes()
    except OSError as err:
        raise IdentityError(f"can't read {path}: {err.strerror}") from err
    try:
        return public_key(seed)
    except IdentityError as err:
        raise IdentityError(f"{path}: {err}") from None


def load_or_make_seed(path: Path) -> str:
    """Return the public key of the seed in ``path``, making the seed (mode 0600) if there is
    none; a seed whose mode was widened is put back to 0600.

    Raises:
        IdentityError: the file exists but holds no user seed, or can't be written.
    """
    if path.exists():
        key = read_public_key(path)
        if path.stat().st_mode & 0o077:
            path.chmod(0o600)
        return key
    seed = nkeys.encode_seed(secrets.token_bytes(32), nkeys.PREFIX_BYTE_USER)
    key = public_key(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(bytes(seed) + b"\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise IdentityError(f"can't write {path}: {err.strerror}") from err
    return key


def make_identities(directory: Path, identities: Iterable[Identity]) -> dict[Identity, str]:
    """Make (or reuse) the seed of each identity under ``directory`` (0700); return their
    public keys.

    Raises:
        IdentityError: a seed file can't be read or written.
    """
    directory.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(OSError):
        directory.chmod(0o700)
    return {ident: load_or_make_seed(seed_path(directory, ident)) for ident in identities}
