"""Processes as Linux's /proc sees them, for the tests that kill a process and check what is
left: children, descendants, and whether one still runs."""

from __future__ import annotations

import contextlib
from pathlib import Path


def _stat_fields(pid: int | str) -> list[str]:
    """The fields of /proc/PID/stat after the command name (which may hold spaces)."""
    return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()


def children(pid: int) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):  # a process that has just exited
                if int(_stat_fields(entry.name)[1]) == pid:
                    found.add(int(entry.name))
    return found


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants, parents first. torchrun starts each worker in a session
    of its own, so its process group is the launcher alone."""
    tree = [pid]
    for member in tree:  # grows as it goes: breadth first
        tree.extend(sorted(children(member)))
    return tree


def alive(pid: int) -> bool:
    """Whether ``pid`` still runs (an unreaped zombie has exited: its files and locks are
    closed)."""
    try:
        return _stat_fields(pid)[0] != "Z"
    except OSError:
        return False
