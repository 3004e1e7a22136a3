"""Publication names: ``<epoch, 20 digits>-<step, 20 digits>-<path under the root, base32>``.

Seed 004, "Publication is append-only": a publication is an empty entry in ``<root>/pub/``
whose name says everything. The path is base32 (A-Z, 2-7, no padding): one case, so a
case-folding filesystem can't merge two names, and no ``-``, so the name splits one way
only. This module is pure: it turns (epoch, step, path) into a name and back, and orders
publications; the stores do the I/O.

Because both numbers are zero-padded to 20 digits, comparing two well-formed names as
strings compares (epoch, step) first, which is what lets :func:`latest` parse only the names
that could win.
"""

from __future__ import annotations

import base64
import functools
import re
from collections.abc import Iterable
from typing import Final, NoReturn

import msgspec

from dispatch_ckpt.errors import InvalidStep, MalformedName, NameTooLong
from dispatch_core.epoch import split_epoch
from dispatch_core.errors import EpochOutOfRange

__all__ = [
    "MAX_NAME_BYTES",
    "MAX_STEP",
    "Publication",
    "check_relpath",
    "decode_path",
    "encode_name",
    "encode_path",
    "latest",
    "parse_name",
    "sort_key",
]

#: The step is printed in 20 decimal digits.
MAX_STEP: Final = 10**20 - 1
#: The longest file name POSIX file systems store (NAME_MAX); S3 allows more, but a root
#: copied from S3 to a file system must keep working, so both stores hold names to this.
MAX_NAME_BYTES: Final = 255

_DIGITS = 20
_B32_ALPHABET: Final = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567")
# Lengths of unpadded base32 text that whole bytes can produce (n bytes -> ceil(8n/5) chars).
_B32_VALID_LENGTH_MOD8: Final = frozenset({0, 2, 4, 5, 7})
_PREFIX = 2 * _DIGITS + 2  # "<epoch>-<step>-"
_WELL_FORMED: Final = re.compile(r"[0-9]{20}-[0-9]{20}-[A-Z2-7]+")
# Every byte to its class for _all_readable: an ASCII digit to "0"; "-" and newline kept;
# anything else (letters, other bytes of UTF-8) to "x".
_SHAPE: Final = bytes(
    ord("0") if 0x30 <= b <= 0x39 else b if b in (0x0A, 0x2D) else ord("x") for b in range(256)
)
_READABLE_LINE: Final = b"\n" + b"0" * _DIGITS + b"-" + b"0" * _DIGITS + b"-"
_CHUNK = 1024
_B32_TEXT: Final = re.compile(r"[A-Z2-7]+")
# A-Z2-7 (values 0..31) -> the digits int(..., 32) reads, 0-9a-v.
_B32_TO_INT_BYTES: Final = bytes.maketrans(
    b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", b"0123456789abcdefghijklmnopqrstuv"
)


class Publication(msgspec.Struct, frozen=True, kw_only=True):
    """One publication: which save, at which step, of which execution (seed 004).

    Order publications with :func:`sort_key` (by name: epoch, then step).
    """

    epoch: int
    """``DISPATCH_EPOCH`` of the execution that published it (``G*10**12 + N*10**6 + R``)."""
    step: int
    """The training step of the save, 0..``MAX_STEP``."""
    path: str
    """The save's path under the root, ``/``-separated, e.g. ``exec/a1/checkpoint-500``."""

    @property
    def name(self) -> str:
        """The entry's name in ``pub/``."""
        return encode_name(self.epoch, self.step, self.path)


def check_relpath(path: str) -> str | None:
    """Say what is wrong with a save's path under the root, or ``None`` if it is fine.

    A path under the root is ``/``-separated, relative, and has no empty, ``.`` or ``..``
    component, so one save has exactly one spelling and one name.
    """
    if not path:
        return "expected a path under the root, found an empty path"
    if "\x00" in path:
        return "expected no NUL character"
    if path.startswith("/"):
        return "expected a path relative to the root, found an absolute one"
    if not _clean_components(path):
        bad = next(p for p in path.split("/") if p in ("", ".", ".."))
        return f"expected no empty, '.' or '..' component, found {bad!r}"
    return None


def _clean_components(path: str) -> bool:
    # True when no component is empty, "." or "..". String tests first: this runs once per
    # name when listing 100,000 of them, and a regex or a split costs several times more.
    if not path or path[0] == "/" or path[-1] == "/" or "//" in path:
        return False
    if path[0] == "." or "/." in path:
        return all(part not in (".", "..") for part in path.split("/"))
    return True


def encode_path(path: str) -> str:
    """Encode a save's path as base32 without padding (A-Z, 2-7; seed 004).

    Args:
        path: the save's path under the root (see :func:`check_relpath`).

    Returns:
        The base32 text of the path's UTF-8 bytes, ``=`` padding removed.
    """
    return base64.b32encode(path.encode("utf-8")).decode("ascii").rstrip("=")


def decode_path(text: str) -> str:
    """Decode the path part of a name; the inverse of :func:`encode_path`.

    Raises:
        ValueError: the text is not canonical unpadded base32 of a UTF-8 path; the message
            says what was expected and what was found.
    """
    if _B32_TEXT.fullmatch(text) is None:
        _raise_not_base32(text)
    n_bytes, unused_bits = divmod(5 * len(text), 8)
    if len(text) % 8 not in _B32_VALID_LENGTH_MOD8:
        raise ValueError(f"expected a base32 length whole bytes give, found {len(text)} chars")
    # Base32 text is a base-32 numeral: int() decodes it in C, far faster than b32decode.
    value = int(text.encode("ascii").translate(_B32_TO_INT_BYTES), 32)
    if value & ((1 << unused_bits) - 1):
        # Unused trailing bits set: two names would spell the same path.
        raise ValueError("expected canonical base32 (unused trailing bits zero)")
    raw = (value >> unused_bits).to_bytes(n_bytes, "big")
    try:
        path = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"expected a UTF-8 path, found bytes that aren't ({err.reason})") from err
    problem = check_relpath(path)
    if problem is not None:
        raise ValueError(f"path {path!r}: {problem}")
    return path


def _raise_not_base32(text: str) -> NoReturn:
    if not text:
        raise ValueError("expected the save's path in base32, found nothing after the step")
    if "=" in text:
        raise ValueError("expected base32 without padding, found '='")
    if any("a" <= c <= "z" for c in text):
        raise ValueError("expected upper-case base32 (A-Z, 2-7), found lower-case letters")
    stray = "".join(sorted({c for c in text if c not in _B32_ALPHABET}))
    raise ValueError(f"expected base32 (A-Z, 2-7), found {stray!r}")


def _check_step(step: object) -> None:
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= MAX_STEP:
        raise InvalidStep(step)


def encode_name(epoch: int, step: int, path: str) -> str:
    """Build a publication's name (seed 004, "Publication is append-only").

    Args:
        epoch: ``DISPATCH_EPOCH``; must be one :func:`dispatch_core.epoch.epoch` can make.
        step: the save's step, 0..``MAX_STEP``.
        path: the save's path under the root (see :func:`check_relpath`).

    Returns:
        ``f"{epoch:020d}-{step:020d}-{base32(path)}"``.

    Raises:
        EpochOutOfRange: the epoch is outside the core's bounds.
        InvalidStep: the step doesn't fit 20 digits or is negative.
        ValueError: the path is not a clean relative path.
        NameTooLong: the name would exceed ``MAX_NAME_BYTES``.
    """
    split_epoch(epoch)
    _check_step(step)
    problem = check_relpath(path)
    if problem is not None:
        raise ValueError(f"save path {path!r}: {problem}")
    name = f"{epoch:020d}-{step:020d}-{encode_path(path)}"
    if len(name) > MAX_NAME_BYTES:
        raise NameTooLong(path, len(name))
    return name


def _check_digits(entry: str, what: str, text: str) -> int:
    if len(text) != _DIGITS or not text.isascii() or not text.isdigit():
        raise MalformedName(entry, f"expected the {what} as {_DIGITS} digits 0-9, found {text!r}")
    return int(text)


@functools.lru_cache(maxsize=1024)
def _epoch_problem(epoch: int) -> str | None:
    # Cached: a root holds few epochs (one per execution) and many names per epoch.
    try:
        split_epoch(epoch)
    except EpochOutOfRange as err:
        return f"expected an epoch dispatch can make, found {err}"
    return None


def parse_name(entry: str) -> Publication:
    """Parse a ``pub/`` entry's name; the inverse of :func:`encode_name`.

    Args:
        entry: the name as listed in ``pub/`` (no directory part).

    Returns:
        The publication the name stands for.

    Raises:
        MalformedName: the name doesn't parse, naming the entry and saying what was
            expected and found (seed 004: never skipped).
    """
    if _WELL_FORMED.fullmatch(entry) is not None:
        epoch, step, path_text = int(entry[:20]), int(entry[21:41]), entry[42:]
    else:
        # The slow path only finds the words for what is wrong.
        parts = entry.split("-")
        if len(parts) != 3:
            raise MalformedName(
                entry,
                f"expected 3 fields separated by '-' (epoch-step-path), found {len(parts)}",
            )
        epoch = _check_digits(entry, "epoch", parts[0])
        step = _check_digits(entry, "step", parts[1])
        path_text = parts[2]
    problem = _epoch_problem(epoch)
    if problem is not None:
        raise MalformedName(entry, problem)
    try:
        path = decode_path(path_text)
    except ValueError as err:
        raise MalformedName(entry, str(err)) from err
    return Publication(epoch=epoch, step=step, path=path)


def _readable(entry: str) -> bool:
    # Whether the entry's epoch and step can be read: "<20 ASCII digits>-<20 ASCII digits>-".
    return (
        len(entry) >= _PREFIX
        and entry[_DIGITS] == "-"
        and entry[_PREFIX - 1] == "-"
        and entry[:_DIGITS].isascii()
        and entry[:_DIGITS].isdigit()
        and entry[_DIGITS + 1 : _PREFIX - 1].isascii()
        and entry[_DIGITS + 1 : _PREFIX - 1].isdigit()
    )


def _all_readable(names: list[str]) -> bool:
    # _readable for every name at once, in C: the names joined one per line, every byte mapped
    # to its class (digit, '-', newline, other), then the readable prefix counted at line
    # starts. Exact: a name holding a newline makes the line count differ, and then the
    # caller asks _readable name by name. In chunks that stay in the CPU's cache: a third
    # faster than one pass over the whole listing.
    for start in range(0, len(names), _CHUNK):
        chunk = names[start : start + _CHUNK]
        text = ("\n" + "\n".join(chunk)).encode("utf-8", "surrogatepass")
        shape = text.translate(_SHAPE)
        if shape.count(b"\n") != len(chunk) or shape.count(_READABLE_LINE) != len(chunk):
            return False
    return True


def latest(entries: Iterable[str]) -> Publication | None:
    """Pick the publication with the greatest epoch, then step (seed 004).

    Only a name that could be the latest is parsed (issue 11 item 7): names sort by epoch,
    then step, as fixed-width digits, so a name whose own 20-digit epoch and step put it below
    the greatest name can't win, whatever follows them. Every other name is parsed, and one
    that doesn't parse is an error naming it, never skipped, because it could be the latest
    one (seed 004): the greatest name, and any name whose epoch and step can't be read (a
    stray file, a temporary name, a field of the wrong width), wherever it sorts.

    Args:
        entries: the names listed in ``pub/`` (every page, on S3).

    Returns:
        The latest publication, or ``None`` when there are no entries. Two saves of one
        execution at one step are told apart by the greater name, so the answer never
        depends on listing order.

    Raises:
        MalformedName: a name that could be the latest doesn't parse.
    """
    names = entries if isinstance(entries, list) else list(entries)
    if not names:
        return None
    if not _all_readable(names):
        for entry in names:
            if not _readable(entry):
                parse_name(entry)  # raises MalformedName with the words for what is wrong
    # Fixed-width digits: string order is (epoch, step) order, then the name breaks a tie.
    return parse_name(max(names))


def sort_key(pub: Publication) -> str:
    """Order publications as :func:`latest` does: by name, i.e. epoch, then step."""
    return pub.name
