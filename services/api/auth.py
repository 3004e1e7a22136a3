"""Bearer tokens: who is calling (an :class:`~dispatch_core.Actor`, human or service).

The tokens file is TOML (``.toml``) or JSON (any other name) and lists one entry per token::

    [[tokens]]
    actor = "alice"            # the name recorded with every command she gives
    kind = "human"             # human | service (only a human may abandon)
    sha256 = "5e884898da28..." # hex SHA-256 of the token: the file holds no secret
    unix_user = "alice"        # optional: her jobs run as this Unix user (Slurm, issue 16)

    [[tokens]]
    actor = "ci"
    kind = "service"
    token = "a-long-random-string"   # or the token itself, in clear

(JSON: ``{"tokens": [{"actor": "alice", "kind": "human", "sha256": "..."}]}``.) Each entry
has exactly one of ``token`` and ``sha256``; ``printf %s "$TOKEN" | sha256sum`` gives the
digest. An actor may have several tokens. The file is read once at start-up: restart the
service to change it.

``unix_user`` maps the actor to the Unix user its jobs run as (``spec.owner``; on a Slurm
cluster whose ``users`` list it, sbatch/scontrol/scancel run as that user). All of an
actor's tokens must agree on it. An actor with a Unix user may submit only as that user and
may command only jobs it owns (or that have no owner); an actor without one (an operator, a
service, ``dispatch up``'s own token) submits jobs without an owner and may command any job.

A request is checked by hashing the presented token and looking the digest up, so no
comparison runs over the secret itself.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Final, Self

import msgspec

from dispatch_core import Actor, ActorKind
from services.api.errors import Unauthorized
from services.common.config import ConfigError

__all__ = ["Authenticator", "TokenEntry", "TokensFile", "hash_token"]

_SHA256: Final = re.compile(r"[0-9a-f]{64}")
_SCHEME: Final = "bearer"


class TokenEntry(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One token of the tokens file.

    Attributes:
        actor: the actor's name, recorded with every command given with this token.
        kind: ``human`` or ``service``.
        token: the token in clear; or
        sha256: the hex SHA-256 digest of the token (lower or upper case).
        unix_user: the Unix user the actor's jobs run as (see the module docstring), or
            ``None``.
    """

    actor: Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
    kind: ActorKind
    token: Annotated[str, msgspec.Meta(min_length=1)] | None = None
    sha256: str | None = None
    unix_user: Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_.][A-Za-z0-9_.-]*$")] | None = None


class TokensFile(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The tokens file: ``tokens``, a list of :class:`TokenEntry`."""

    tokens: tuple[TokenEntry, ...]


def hash_token(token: str) -> str:
    """Return the hex SHA-256 digest of ``token`` (what the tokens file's ``sha256`` holds)."""
    return hashlib.sha256(token.encode()).hexdigest()


class Authenticator:
    """Maps a bearer token to its actor."""

    def __init__(
        self, actors: Mapping[str, Actor], unix_users: Mapping[str, str] | None = None
    ) -> None:
        """Use ``actors``: hex SHA-256 digest of a token -> its actor; ``unix_users``:
        actor name -> the Unix user its jobs run as."""
        self._actors = dict(actors)
        self.unix_users: Mapping[str, str] = dict(unix_users or {})
        """Actor name -> its Unix user (the tokens file's ``unix_user``)."""

    @classmethod
    def from_file(cls, path: str | Path) -> Self:
        """Read the tokens file at ``path`` (TOML for ``*.toml``, else JSON).

        Raises:
            ConfigError: the file can't be read or parsed, an entry has neither or both of
                ``token`` and ``sha256``, a digest isn't 64 hex digits, or a token is listed
                twice; the message names the file and the entry.
        """
        path = Path(path)
        try:
            data = path.read_bytes()
        except OSError as err:
            raise ConfigError(f"tokens file {str(path)!r}: {err.strerror or err}") from err
        try:
            if path.suffix.lower() == ".toml":
                parsed = msgspec.convert(tomllib.loads(data.decode()), TokensFile)
            else:
                parsed = msgspec.json.decode(data, type=TokensFile)
        except (msgspec.DecodeError, tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
            raise ConfigError(f"tokens file {str(path)!r}: {err}") from err
        return cls.from_entries(parsed.tokens, source=str(path))

    @classmethod
    def from_entries(cls, entries: tuple[TokenEntry, ...], *, source: str = "tokens") -> Self:
        """Build from parsed entries (see :meth:`from_file` for the checks).

        Raises:
            ConfigError: as :meth:`from_file`.
        """
        actors: dict[str, Actor] = {}
        users: dict[str, str | None] = {}
        for i, entry in enumerate(entries):
            where = f"tokens file {source!r}, tokens[{i}] (actor {entry.actor!r})"
            if (entry.token is None) == (entry.sha256 is None):
                raise ConfigError(f"{where}: give exactly one of 'token' and 'sha256'")
            if entry.sha256 is not None:
                digest = entry.sha256.lower()
                if not _SHA256.fullmatch(digest):
                    raise ConfigError(f"{where}: sha256 must be 64 hex digits")
            else:
                assert entry.token is not None
                digest = hash_token(entry.token)
            if digest in actors:
                raise ConfigError(f"{where}: the same token is listed twice")
            actors[digest] = Actor(name=entry.actor, kind=entry.kind)
            if users.setdefault(entry.actor, entry.unix_user) != entry.unix_user:
                raise ConfigError(
                    f"{where}: unix_user {entry.unix_user!r} differs from "
                    f"{users[entry.actor]!r} of the actor's other token"
                )
        return cls(actors, {name: user for name, user in users.items() if user})

    def __len__(self) -> int:
        """Return the number of tokens."""
        return len(self._actors)

    def authenticate(self, authorization: str | None) -> Actor:
        """Return the actor of an ``Authorization: Bearer <token>`` header's token.

        Raises:
            Unauthorized: no header, another scheme, or a token the file doesn't hold.
        """
        if not authorization:
            raise Unauthorized("no bearer token: send 'Authorization: Bearer <token>'")
        scheme, _, token = authorization.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != _SCHEME or not token:
            raise Unauthorized("the Authorization header must be 'Bearer <token>'")
        actor = self._actors.get(hash_token(token))
        if actor is None:
            raise Unauthorized("the bearer token is not valid")
        return actor
