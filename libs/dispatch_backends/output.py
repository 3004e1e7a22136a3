"""Reading an object's output from a file, bounded (shared by the local and Slurm backends)."""

from __future__ import annotations

from pathlib import Path

from dispatch_backends.protocol import OUTPUT_CHUNK_LIMIT, OutputChunk

__all__ = ["check_window", "read_file_chunk"]


def check_window(offset: int, limit: int) -> int:
    """Return ``limit`` capped at :data:`OUTPUT_CHUNK_LIMIT`.

    Raises:
        ValueError: a negative offset or limit.
    """
    if offset < 0:
        raise ValueError(f"offset must be >= 0, got {offset}")
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    return min(limit, OUTPUT_CHUNK_LIMIT)


def read_file_chunk(path: Path, offset: int, limit: int, *, live: bool) -> OutputChunk:
    """Read at most ``limit`` bytes (capped) of ``path`` from byte ``offset``.

    A missing file reads as empty (an output not written yet). ``live`` is the caller's
    word on whether the writer may still write; it must be decided *before* the read, so a
    writer that ends in between is read again rather than cut short.

    Raises:
        ValueError: a negative offset or limit.
        OSError: the file exists but can't be read.
    """
    limit = check_window(offset, limit)
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            data = b""
            if offset < size and limit:
                f.seek(offset)
                data = f.read(limit)
            size = max(size, offset + len(data))
    except FileNotFoundError:
        data, size = b"", 0
    return OutputChunk(data=data, offset=offset, size=size, live=live, where=str(path))
