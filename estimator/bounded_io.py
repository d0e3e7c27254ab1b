"""Reading untrusted files and JSON within bounds: the checks every reader of a user's file needs, in one place.

Model folders' config.json, recipe.yaml, users' training configs and safetensors headers are all read through
:func:`open_regular` / :func:`read_regular_file`; JSON text from a file or the Hub is checked with
:func:`json_nesting_breach` before ``json`` (recursive in C) sees it. Each caller turns a refusal reason into its
own error class (estimator/errors.py) with its own words for what the file should be.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

Refuse = Callable[[str], Exception]  # a refusal reason -> the caller's error


@contextmanager
def open_regular(path: str | Path, refuse: Refuse) -> Iterator[tuple[int, os.stat_result]]:
    """(file descriptor, fstat) of ``path`` if it is a regular file, closed on exit.

    Opened with O_NONBLOCK and checked with fstat before any read, so a FIFO, a device or a socket (even behind a
    symlink) is refused at once instead of blocking or streaming forever."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise refuse(f"cannot read {path}: cannot open it ({exc.strerror or type(exc).__name__})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise refuse(f"{path} is not a regular file")
        yield fd, info
    finally:
        os.close(fd)


def read_regular_file(path: str | Path, limit: int, refuse: Refuse, too_large: Callable[[int], str]) -> bytes:
    """The bytes of ``path`` if it is a regular file of at most ``limit`` bytes (checked before reading by its size,
    and again while reading, for a file that grows); ``too_large(size)`` words the refusal of a larger one."""
    with open_regular(path, refuse) as (fd, info):
        if info.st_size > limit:
            raise refuse(too_large(info.st_size))
        chunks: list[bytes] = []
        size = 0
        try:
            while chunk := os.read(fd, min(1 << 20, limit + 1 - size)):
                size += len(chunk)
                if size > limit:
                    raise refuse(too_large(size))
                chunks.append(chunk)
        except OSError as exc:
            raise refuse(f"cannot read {path}: {exc.strerror or type(exc).__name__}") from None
        return b"".join(chunks)


def json_nesting_breach(text: str, limit: int) -> int | None:
    """The line on which JSON ``text`` first nests deeper than ``limit`` arrays/objects (brackets inside strings do
    not count), or None: a cheap scan that bounds ``json.loads``'s recursion before it runs."""
    depth, in_string, escaped, line = 0, False, False, 1
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > limit:
                return line
        elif char in "]}":
            depth -= 1
        if char == "\n":
            line += 1
    return None
