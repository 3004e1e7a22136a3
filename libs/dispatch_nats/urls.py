"""NATS server URLs as they may be shown: never with the credentials they carry (public)."""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterable

__all__ = ["redact_url", "redact_urls"]


def redact_url(url: str) -> str:
    """``url`` with any userinfo (``user:password@`` or a token) replaced by ``***@``."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "<unparsable url>"
    if "@" not in parts.netloc:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"***@{host}"))


def redact_urls(urls: Iterable[str]) -> list[str]:
    """Each of ``urls`` with its userinfo redacted."""
    return [redact_url(u) for u in urls]
