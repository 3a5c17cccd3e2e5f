"""Atomic writes: a crash never leaves a half-written artifact that a later run would trust, and
a full disk is one line (:class:`geospec.errors.OutOfSpace`) with nothing partial left behind."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from geospec.storage.disk import out_of_space, writing


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it is fsynced and renamed over ``path``.

    Use it for writers that want a file name (``safetensors.torch.save_file``, ``torch.save``).
    A write that fails for want of space raises :class:`geospec.errors.OutOfSpace` naming
    ``path``; the temporary file is removed either way.
    """
    path = Path(path)
    with writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
    tmp = Path(tmp_name)
    try:
        tmp.chmod(0o666 & ~_umask())  # mkstemp makes it private; an artifact is an ordinary file
        yield tmp
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as error:
        full = out_of_space(error, path)  # asked before the partial file frees its space
        tmp.unlink(missing_ok=True)
        if full is None or full is error:
            raise
        raise full from error


def _umask() -> int:
    mask = os.umask(0)  # reading the umask means setting it: put it straight back
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_open(
    path: str | Path, mode: str = "w", encoding: str | None = "utf-8"
) -> Iterator[IO[Any]]:
    """Open a temporary file for writing that replaces ``path`` only when the block succeeds."""
    with atomic_path(path) as tmp, open(tmp, mode, encoding=None if "b" in mode else encoding) as f:
        yield f


def atomic_write_text(path: str | Path, text: str) -> None:
    with atomic_open(path) as handle:
        handle.write(text)


def atomic_write_json(path: str | Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def check_new_directory(path: Path, named: str) -> None:
    """Refuse ``path`` (shown as ``named``: "--to DIR", a path) when it exists and is not an
    empty directory: an export never writes into, or replaces, what is already there (one line,
    exit status 2)."""
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        from geospec.errors import UsageError

        raise UsageError(f"{named}: already exists and is not empty; give a new directory")


@contextlib.contextmanager
def atomic_directory(path: str | Path) -> Iterator[Path]:
    """Yield a new staging directory beside ``path``; on success it is renamed to ``path`` (which
    must not exist, or be empty), so a reader sees the whole directory or none of it. On failure
    the staging directory is removed, and a full disk is :class:`geospec.errors.OutOfSpace`."""
    import shutil

    path = Path(path)
    with writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(
            tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
        )
    try:
        staging.chmod(0o777 & ~_umask())  # mkdtemp makes it private; an artifact is ordinary
        with writing(path):
            yield staging
        if path.is_dir() and not any(path.iterdir()):
            path.rmdir()
        os.replace(staging, path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # gone already after a successful rename
