"""Advisory file locks: one process builds a data cache while others wait, and no two processes
ever train into the same directory.

Several ``geospec run`` processes may share one run directory (to use more cores, or more
machines on a shared disk): each trains the arm-seed runs that no other process has claimed and
leaves the claimed ones to their owner. The locks are POSIX ``flock`` locks, released by the
kernel when their process dies, so a killed run never leaves a stale claim behind. Where
``fcntl`` does not exist (Windows) every lock is granted and only the atomic writes protect
the results.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def file_lock(path: Path, wait: bool = True) -> Iterator[bool]:
    """Hold an exclusive lock on ``path`` (created if missing); yields whether it was granted.

    With ``wait`` the call blocks until the lock is free (and always yields True).
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield True
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def claim_path(directory: Path) -> Path:
    """The lock file of a training directory. It sits beside the directory, not inside, so that
    emptying the directory to start a run over keeps the claim."""
    return directory.parent / f".{directory.name}.lock"


@contextlib.contextmanager
def claim(directory: Path) -> Iterator[bool]:
    """Claim ``directory`` for training without waiting; yields whether this process has it."""
    with file_lock(claim_path(directory), wait=False) as granted:
        yield granted
