"""Structured logs: stdlib ``logging`` with one JSON formatter shared by the services.

The message is a stable dotted event name (``attempt.started``); context goes in ``extra``
and comes out as fields of the JSON object. :class:`JobLogger` binds a job's id to every
line (Temporal's pattern).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from datetime import UTC, datetime
from typing import Any, Final

import msgspec

__all__ = ["JobLogger", "JsonFormatter", "setup_logging"]

# Attributes every LogRecord has; anything else came from `extra`.
_STANDARD: Final = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}
# Values msgspec can't encode (exceptions, paths) are logged by their repr.
_encoder: Final = msgspec.json.Encoder(enc_hook=repr)


class JsonFormatter(logging.Formatter):
    """Format a record as one JSON object: time, level, logger, event, extra fields."""

    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname.lower(),
            "service": self.service,
            "logger": record.name,
            "event": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return _encoder.encode(out).decode(errors="replace")


def setup_logging(service: str, level: str = "info", *, json: bool = True) -> None:
    """Send the root logger to stderr, as JSON lines (``json=True``) or plain text."""
    handler = logging.StreamHandler(sys.stderr)
    if json:
        handler.setFormatter(JsonFormatter(service))
    else:
        handler.setFormatter(logging.Formatter(f"%(asctime)s {service} %(levelname)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


class JobLogger(logging.LoggerAdapter[logging.Logger]):
    """A logger that adds ``job_id`` (and any other bound fields) to every line."""

    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        extra = dict(self.extra or {})
        extra.update(kwargs.get("extra") or {})
        kwargs["extra"] = extra
        return msg, kwargs
