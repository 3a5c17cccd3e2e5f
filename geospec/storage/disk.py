"""A full disk, recognised wherever geospec writes and reported as one line
(:class:`geospec.errors.OutOfSpace`).

Writers fail differently on a full file system: Python's own writes raise ``OSError`` with
``ENOSPC`` (or ``EDQUOT`` for a spent quota), safetensors an error whose text holds the OS's
words, and ``torch.save`` a ``RuntimeError`` about an unexpected file position. The last says
nothing about space, so a failed write also counts as out of space when the file system had
almost nothing left at the instant it failed (checked before the partial file is removed).
"""

from __future__ import annotations

import contextlib
import errno
import shutil
from collections.abc import Iterator
from pathlib import Path

from geospec.errors import GeospecError, OutOfSpace

#: errno values of a full file system and of a spent quota.
FULL = (errno.ENOSPC, errno.EDQUOT)
#: What writers that do not raise OSError say when the OS refused for want of space.
FULL_WORDS = ("no space left on device", "os error 28", "disk quota exceeded", "os error 122")
#: Below this much free space, a failed write is taken to have failed for want of space.
NEARLY_FULL = 1 << 20


def free_bytes(directory: Path) -> int | None:
    """Free bytes (for this user) on the file system of ``directory`` or its nearest existing
    parent; None when even that cannot be asked."""
    for candidate in (directory, *directory.parents):
        with contextlib.suppress(OSError):
            if candidate.exists():
                return shutil.disk_usage(candidate).free
    return None


def says_full(error: BaseException) -> bool:
    """Whether ``error`` itself says the file system is full (errno or the OS's words)."""
    if isinstance(error, OSError) and error.errno in FULL:
        return True
    text = str(error).lower()
    return any(words in text for words in FULL_WORDS)


def out_of_space(error: BaseException, path: Path) -> OutOfSpace | None:
    """The one-line error for a write of ``path`` that raised ``error``, when the cause is a
    full file system; None otherwise (the error is something else and goes on as it is)."""
    if isinstance(error, GeospecError):
        return error if isinstance(error, OutOfSpace) else None  # already said what it is
    if not isinstance(error, Exception):
        return None  # an interrupt is never a full disk
    free = free_bytes(path.parent)
    if not says_full(error) and (free is None or free >= NEARLY_FULL):
        return None
    return OutOfSpace(str(path.parent), path.name, "unknown" if free is None else size(free))


def unplaced_out_of_space(error: BaseException) -> OutOfSpace | None:
    """:class:`OutOfSpace` for an error that says the disk is full but was raised where no
    writer named its file (the OS error's own file name, where it has one, is used)."""
    if isinstance(error, GeospecError) or not says_full(error):
        return None
    filename = getattr(error, "filename", None)
    if filename:
        path = Path(str(filename))
        return out_of_space(error, path) or OutOfSpace(str(path.parent), path.name, "unknown")
    return OutOfSpace("an unnamed directory", "a file", "unknown")


@contextlib.contextmanager
def writing(path: Path) -> Iterator[None]:
    """Turn a failure of the writes in the block (they write ``path``) into
    :class:`OutOfSpace` when the file system is full."""
    try:
        yield
    except Exception as error:
        full = out_of_space(error, Path(path))
        if full is None or full is error:
            raise
        raise full from error


def size(count: int) -> str:
    """A byte count as people read it: ``0 B``, ``12.0 KiB``, ``3.4 GiB``."""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{count} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
