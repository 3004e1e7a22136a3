"""Errors raised by the checkpoint helper.

Every error is a subclass of :class:`CkptError`. Messages say what failed, for which entry,
path or variable, and what was expected against what was found; the same facts are
attributes, so a caller can act on them without parsing the message.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "AlreadyPublished",
    "CkptError",
    "IncompatibleSave",
    "InvalidEnvironment",
    "InvalidPath",
    "InvalidRoot",
    "InvalidStep",
    "MalformedName",
    "MissingEnvironment",
    "NameTooLong",
    "SaveNotFound",
    "ScanTimeout",
    "StoreError",
    "UnknownStep",
]


class CkptError(Exception):
    """Root of every error raised by ``dispatch_ckpt``."""

    #: Whether trying the same operation again may succeed (a store hiccup), as opposed to a
    #: fact that won't change (a malformed name, a duplicate publication).
    retryable: ClassVar[bool] = False


class MalformedName(CkptError, ValueError):
    """An entry in ``pub/`` whose name doesn't parse (seed 004, "Publication is append-only").

    It is an error, never skipped when it could be the latest one; ``latest`` passes over only
    a name whose own 20-digit epoch and step put it below the latest.

    Attributes:
        entry: the entry's name as listed (under ``pub/``).
        problem: what is wrong, as "expected ..., found ...".
    """

    def __init__(self, entry: str, problem: str) -> None:
        super().__init__(f"publication entry {entry!r} does not parse: {problem}")
        self.entry, self.problem = entry, problem


class AlreadyPublished(CkptError):
    """The publication's name already exists: the exclusive create lost (seed 004).

    A second publish of the same name is an error, never a silent success.

    Attributes:
        name: the entry's name.
        where: the entry's full location (path or ``s3://`` URL).
    """

    def __init__(self, name: str, where: str) -> None:
        super().__init__(
            f"publication {name!r} already exists at {where}: "
            "expected to create it exclusively, found it there"
        )
        self.name, self.where = name, where


class NameTooLong(CkptError, ValueError):
    """A publication name would exceed 255 bytes, the longest file name POSIX stores allow.

    Attributes:
        path: the save's path under the root.
        length: the name's length in bytes.
    """

    def __init__(self, path: str, length: int) -> None:
        super().__init__(
            f"the publication name for save {path!r} would be {length} bytes: expected at "
            "most 255 (shorten the save's path under the root)"
        )
        self.path, self.length = path, length


class InvalidStep(CkptError, ValueError):
    """A step that doesn't fit a publication name (20 decimal digits, not negative).

    Attributes:
        step: the value given.
    """

    def __init__(self, step: object) -> None:
        super().__init__(f"step {step!r} is not an int in 0..{10**20 - 1}")
        self.step = step


class InvalidRoot(CkptError, ValueError):
    """A checkpoint root that is neither a path nor an ``s3://bucket[/prefix]`` URL.

    Attributes:
        root: the root given.
        problem: what is wrong.
    """

    def __init__(self, root: str, problem: str) -> None:
        super().__init__(f"checkpoint root {root!r}: {problem}")
        self.root, self.problem = root, problem


class InvalidPath(CkptError, ValueError):
    """A save's path that can't be published under the root.

    Attributes:
        path: the path given.
        root: the checkpoint root.
        problem: what is wrong (outside the root, inside ``pub/``, ...).
    """

    def __init__(self, path: str, root: str, problem: str) -> None:
        super().__init__(f"save {path!r} under root {root!r}: {problem}")
        self.path, self.root, self.problem = path, root, problem


class SaveNotFound(CkptError):
    """Publishing a save that isn't there (a typo, or a save another node hasn't written).

    Attributes:
        path: the save's full location.
    """

    def __init__(self, path: str) -> None:
        super().__init__(f"save {path!r} not found: expected a file or folder there")
        self.path = path


class MissingEnvironment(CkptError):
    """``DISPATCH_ATTEMPT`` or ``DISPATCH_EPOCH`` is needed but neither set nor given.

    Attributes:
        variable: the variable's name.
        needed_for: what needed it ("publish", "the execution folder").
    """

    def __init__(self, variable: str, needed_for: str) -> None:
        super().__init__(
            f"{variable} is not set: {needed_for} needs it (dispatch sets it for each "
            "execution; outside dispatch, give it explicitly)"
        )
        self.variable, self.needed_for = variable, needed_for


class InvalidEnvironment(CkptError, ValueError):
    """``DISPATCH_ATTEMPT`` or ``DISPATCH_EPOCH`` holds a value that can't be used.

    Attributes:
        variable: the variable's name.
        value: the value found.
        problem: what was expected.
    """

    def __init__(self, variable: str, value: str, problem: str) -> None:
        super().__init__(f"{variable}={value!r}: {problem}")
        self.variable, self.value, self.problem = variable, value, problem


class StoreError(CkptError):
    """The store failed an operation (I/O error, S3 error, unreachable endpoint).

    Attributes:
        operation: what was being done ("list pub/", "create entry", ...).
        where: the path or URL it was done on.
        detail: the underlying error's text.
    """

    retryable: ClassVar[bool] = True

    def __init__(self, operation: str, where: str, detail: str) -> None:
        super().__init__(f"{operation} at {where} failed: {detail}")
        self.operation, self.where, self.detail = operation, where, detail


class ScanTimeout(StoreError):
    """A watch scan of the execution folder didn't finish in time (seed 004, "Limits").

    Attributes:
        timeout_s: the limit, in seconds.
    """

    def __init__(self, where: str, timeout_s: float) -> None:
        super().__init__(
            "scan", where, f"not finished within {timeout_s:g} s (expected within --timeout)"
        )
        self.timeout_s = timeout_s


class UnknownStep(CkptError, ValueError):
    """A complete save whose step can't be read from its folder's name.

    Attributes:
        path: the save's path under the root.
    """

    def __init__(self, path: str) -> None:
        super().__init__(
            f"save {path!r} is complete but its name holds no step: expected digits in the "
            "folder's name (e.g. step-100, checkpoint-100, 100)"
        )
        self.path = path


class IncompatibleSave(CkptError):
    """A published save that an integration can't load (e.g. a folder where the PyTorch
    helper expects the single file it writes).

    Attributes:
        path: the save's full location.
        problem: what was expected and found.
    """

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"save {path!r} can't be loaded: {problem}")
        self.path, self.problem = path, problem
