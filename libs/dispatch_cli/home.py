"""Where ``dispatch up`` keeps its data, and what a client reads from there.

The data directory (``--data-dir``, else ``$DISPATCH_DATA_DIR``, else
``$XDG_DATA_HOME/dispatch``, else ``~/.local/share/dispatch``) holds::

    token            the human token of the API (0600), made once, the same on every restart
    tokens.toml      the API's tokens file (its SHA-256 only: no secret)
    clusters.json    the clusters file: the local cluster ``local``, then those of
                     ``dispatch up --clusters FILE`` (written on every start)
    up.json          the running ``up``: API address, pid, NATS URL (removed when it stops)
    up.lock          held while an ``up`` runs on this directory
    nats/            the JetStream store (records, statuses, discoveries)
    nats.conf        the private nats-server's configuration: each service's identity (public
                     nkey) and permissions, no anonymous access, no monitoring port
    nats-identities/ one nkey seed per service identity (0600, kept across starts)
    local/           the local backend's objects (each execution's stdout, stderr, status)
    logs/            one log file per service (JSON lines)
    escalations.log  every escalation the notifier delivered to the terminal channel
    work/            the default working directory of jobs that don't set one

Clients (``dispatch status`` etc.) find the API address and the token in ``up.json`` and
``token`` when neither ``--api``/``DISPATCH_API`` nor ``--token``/``DISPATCH_TOKEN`` says.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

import msgspec

__all__ = [
    "DEFAULT_API",
    "STATE_FILE",
    "TOKEN_FILE",
    "UpState",
    "default_data_dir",
    "load_or_make_token",
    "read_state",
    "read_token",
    "remove_state",
    "write_private",
    "write_state",
]

DEFAULT_API: Final = "http://127.0.0.1:8080"
"""Where a client looks when nothing else names the API: ``dispatch up``'s default."""

STATE_FILE: Final = "up.json"
TOKEN_FILE: Final = "token"


class UpState(msgspec.Struct, frozen=True, kw_only=True):
    """What a running ``dispatch up`` tells clients (``<data dir>/up.json``).

    Attributes:
        api: the API's base URL (``http://127.0.0.1:8080``).
        pid: the ``dispatch up`` process.
        nats_url: its NATS: its private nats-server, or the ``--nats`` URLs (comma-separated,
            without any credentials they carry).
        data_dir: the data directory.
        cluster: the local cluster's name.
        local_data_dir: the local backend's data directory (for fault injection).
        started_at: when it was ready.
        clusters: every cluster it serves, the local one first (``--clusters``).
    """

    api: str
    pid: int
    nats_url: str
    data_dir: str
    cluster: str
    local_data_dir: str
    started_at: datetime
    clusters: tuple[str, ...] = ()


_STATE_DECODER: Final = msgspec.json.Decoder(UpState)


def default_data_dir(env: Mapping[str, str]) -> Path:
    """Return the data directory when ``--data-dir`` gives none (see the module docstring)."""
    if env.get("DISPATCH_DATA_DIR"):
        return Path(env["DISPATCH_DATA_DIR"]).expanduser()
    base = env.get("XDG_DATA_HOME") or str(Path(env.get("HOME") or Path.home()) / ".local/share")
    return Path(base).expanduser() / "dispatch"


def write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (a temporary file renamed), readable by its owner
    only (0600)."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def read_token(data_dir: Path) -> str | None:
    """Return the token kept in ``data_dir``, or ``None`` when there is none (or it can't be
    read by this user)."""
    try:
        return (data_dir / TOKEN_FILE).read_text().strip() or None
    except OSError:
        return None


def load_or_make_token(data_dir: Path) -> str:
    """Return the token kept in ``data_dir``; make one (and keep it, 0600) the first time.

    Its mode is put back to 0600 when someone widened it.
    """
    path = data_dir / TOKEN_FILE
    token = read_token(data_dir)
    if token is None:
        token = secrets.token_urlsafe(32)
        write_private(path, (token + "\n").encode())
    elif path.stat().st_mode & 0o077:
        path.chmod(0o600)
    return token


def read_state(data_dir: Path) -> UpState | None:
    """Return the state of the ``up`` running on ``data_dir``, or ``None`` when none wrote
    one (or its process is gone: a state left by a killed ``up`` is ignored)."""
    try:
        state = _STATE_DECODER.decode((data_dir / STATE_FILE).read_bytes())
    except (OSError, msgspec.DecodeError):
        return None
    try:
        os.kill(state.pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # alive, someone else's
    return state


def write_state(data_dir: Path, state: UpState) -> None:
    """Write ``up.json`` (atomically)."""
    write_private(data_dir / STATE_FILE, msgspec.json.encode(state))


def remove_state(data_dir: Path, pid: int) -> None:
    """Remove ``up.json`` if the ``up`` of process ``pid`` wrote it."""
    try:
        state = _STATE_DECODER.decode((data_dir / STATE_FILE).read_bytes())
    except (OSError, msgspec.DecodeError):
        return
    if state.pid == pid:
        with contextlib.suppress(OSError):
            (data_dir / STATE_FILE).unlink()


def utcnow() -> datetime:
    """The current time, UTC."""
    return datetime.now(UTC)
