"""Advisory file locks: one process builds a data cache while others wait, no two processes
ever train into the same directory, and no two compute the same prune unit (the second waits
for the first's result and reuses it).

Several ``geospec run`` processes may share one run directory (to use more cores, or more
machines on a shared disk): each trains the arm-seed runs that no other process has claimed and
leaves the claimed ones to their owner. The locks are POSIX ``flock`` locks, released by the
kernel when their process dies, so a killed run never leaves a stale claim behind. Where
``fcntl`` does not exist (Windows) every lock is granted and only the atomic writes protect
the results.

A claim's lock file also records who holds it (:func:`claim_holder`: pid, host, Slurm job,
since when) for ``geospec status``; the holder empties it on release, so a record whose process
is gone is a claim whose holder died (:func:`holder_alive`). The record is only information:
the lock alone decides who trains.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


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
def claim(
    directory: Path, waiting: Callable[[dict[str, Any] | None], None] | None = None
) -> Iterator[bool]:
    """Claim ``directory`` without waiting; yields whether this process has it.

    With ``waiting``, a claim another process holds is waited for instead (and then always
    granted): ``waiting`` is first told who holds it (:func:`claim_holder`; None when its record
    is not written yet), so that the wait is said. The holder writes its record into the lock
    file while it holds the claim and empties it on release."""
    path = claim_path(directory)
    with contextlib.ExitStack() as held:
        granted = held.enter_context(file_lock(path, wait=False))
        if not granted and waiting is not None:
            waiting(claim_holder(directory))
            granted = held.enter_context(file_lock(path, wait=True))
        if granted:
            _write_holder(path, holder_record())
        try:
            yield granted
        finally:
            if granted:
                _write_holder(path, None)


def holder_record() -> dict[str, Any]:
    """Who this process is: pid, host, the Slurm job it runs in (if any) and since when."""
    record: dict[str, Any] = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "since": time.time(),
    }
    job = os.environ.get("SLURM_ARRAY_JOB_ID") or os.environ.get("SLURM_JOB_ID")
    if job:
        task = os.environ.get("SLURM_ARRAY_TASK_ID")
        record["job"] = f"{job}_{task}" if task and os.environ.get("SLURM_ARRAY_JOB_ID") else job
    return record


def _write_holder(path: Path, record: dict[str, Any] | None) -> None:
    """Replace the lock file's content in place (not atomically: the lock is on this inode)."""
    try:
        with open(path, "r+") as handle:
            handle.truncate(0)
            if record is not None:
                handle.write(json.dumps(record))
    except OSError:  # the record is informative only; the lock still holds
        pass


def claim_holder(directory: Path) -> dict[str, Any] | None:
    """The record of the process holding (or that held and died holding) ``directory``'s claim:
    None when nobody claims it; ``{"damaged": True}`` when the record cannot be read."""
    try:
        text = claim_path(directory).read_text()
    except (OSError, UnicodeDecodeError):
        return None
    if not text.strip():
        return None
    try:
        record = json.loads(text)
    except ValueError:
        return {"damaged": True}
    valid = (
        isinstance(record, dict)
        and isinstance(record.get("pid"), int)
        and isinstance(record.get("host"), str)
        and isinstance(record.get("since"), (int, float))
    )
    return record if valid else {"damaged": True}


def holder_alive(record: dict[str, Any]) -> bool | None:
    """Whether the holder in ``record`` still runs: known only on its own host (None elsewhere)."""
    if record.get("host") != socket.gethostname():
        return None
    try:
        os.kill(int(record["pid"]), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True
