"""The CLI's errors and exit codes.

Every failure the CLI reports is a :class:`CliError` carrying the exit code it ends with, so
scripts can tell "the API said no" from "the API is not there" without parsing text:

====  =========================================================================================
code  meaning
====  =========================================================================================
0     success (``watch``: the job settled ``succeeded``)
1     failure: the API answered 5xx, the local services failed, anything unexpected
2     usage: a bad option or argument, a job file that can't be read or parsed
3     the API can't be reached (nothing listens at the address, or it timed out)
4     authentication: the token is missing or refused (401), or the actor may not (403)
5     not found (404): no such job
6     refused (409): the core refused the command; the message is its reason
7     invalid request (400/413): the API names the field at fault
8     ``watch``: the job settled ``failed`` or ``cancelled``
9     the job's record can't be read (422 ``record-unreadable``: an event in it does not
      decode, or its writer may not write it); retrying won't help, a person must look at
      the record. ``watch`` ends with it at once (the API's stream says so as an event)
130   interrupted (Ctrl-C)
====  =========================================================================================
"""

from __future__ import annotations

from typing import ClassVar, Final

from dispatch_cli.program import program

__all__ = [
    "EXIT_AUTH",
    "EXIT_FAILURE",
    "EXIT_INTERRUPTED",
    "EXIT_INVALID",
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_REFUSED",
    "EXIT_UNREACHABLE",
    "EXIT_UNREADABLE",
    "EXIT_USAGE",
    "EXIT_WATCH_UNSUCCESSFUL",
    "ApiError",
    "CliError",
    "Unreachable",
    "UsageError",
]

EXIT_OK: Final = 0
EXIT_FAILURE: Final = 1
EXIT_USAGE: Final = 2
EXIT_UNREACHABLE: Final = 3
EXIT_AUTH: Final = 4
EXIT_NOT_FOUND: Final = 5
EXIT_REFUSED: Final = 6
EXIT_INVALID: Final = 7
EXIT_WATCH_UNSUCCESSFUL: Final = 8
EXIT_UNREADABLE: Final = 9
EXIT_INTERRUPTED: Final = 130


class CliError(Exception):
    """Root of the CLI's errors: a message for a person and the exit code to end with."""

    default_exit_code: ClassVar[int] = EXIT_FAILURE

    def __init__(self, message: str, *, exit_code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code: int = self.default_exit_code if exit_code is None else exit_code


class UsageError(CliError):
    """A bad argument or an unreadable job file (exit 2)."""

    default_exit_code: ClassVar[int] = EXIT_USAGE


class Unreachable(CliError):
    """Nothing answers at the API's address (exit 3); the message says how to start one."""

    default_exit_code: ClassVar[int] = EXIT_UNREACHABLE

    def __init__(self, url: str, why: str) -> None:
        super().__init__(
            f"cannot reach the dispatch API at {url} ({why}).\n"
            f"  Is it running? Start the embedded default with `{program()} up` (in another "
            "terminal),\n  or point --api / DISPATCH_API at a running API."
        )
        self.url, self.why = url, why


_BY_STATUS: Final = {
    400: EXIT_INVALID,
    401: EXIT_AUTH,
    403: EXIT_AUTH,
    404: EXIT_NOT_FOUND,
    409: EXIT_REFUSED,
    413: EXIT_INVALID,
    422: EXIT_UNREADABLE,
}


class ApiError(CliError):
    """The API answered with an error (``{"error": {"code", "message", "field"?}}``).

    Attributes:
        status: the HTTP status.
        code: the API's stable error token (``refused``, ``invalid``, ...).
        field: the request field at fault, when one is.
        api_message: the API's own message (for ``refused``, the core's reason).
    """

    def __init__(
        self, status: int, code: str, api_message: str, *, field: str | None = None, url: str = ""
    ) -> None:
        self.status, self.code, self.api_message, self.field = status, code, api_message, field
        super().__init__(
            _describe(status, code, api_message, field, url),
            exit_code=_BY_STATUS.get(status, EXIT_FAILURE),
        )


def _describe(status: int, code: str, message: str, field: str | None, url: str) -> str:
    where = f" (field {field})" if field else ""
    match status:
        case 401:
            return (
                f"the API at {url} refused the token (401 {code}): {message}\n"
                f"  Give the right one with --token or DISPATCH_TOKEN; `{program()} up` prints its "
                "token and keeps it in <data dir>/token."
            )
        case 403:
            return f"forbidden (403): {message}"
        case 404:
            return f"not found (404): {message}"
        case 409:
            return f"refused (409): {message}"
        case 400 | 413:
            return f"invalid request ({status} {code}){where}: {message}"
        case 422:
            return (
                f"the job's record can't be read (422 {code}): {message}\n"
                "  Retrying won't help: a person must look at that event of the record. "
                "Every other job still answers."
            )
        case _:
            return f"the API failed ({status} {code}){where}: {message}"
