"""Reading a JSON artifact back: the one reader every stage, command and report uses, and
what keeps a recomputable one from being trusted (torch-free)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from geospec.errors import UsageError
from geospec.storage.digests import seal_broken


def read_json(path: Path) -> Any:
    """A JSON artifact's content, None when it does not exist; a damaged one is a UsageError
    naming the file and what to do."""
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise UsageError(f"{path}: not valid JSON ({error}); delete it and rerun") from None


def read_json_or_none(path: Path) -> Any:
    """A recomputable JSON artifact's content, or None when it is missing or unreadable."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def json_problem(path: Path, *keys: str) -> str | None:
    """What keeps a recomputable JSON artifact from being trusted (missing, unreadable, not an
    object, without ``keys``, or its content changed after geospec sealed it), or None."""
    shown = path.name
    if not path.is_file():
        return f"{shown} is missing"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return f"{shown} is unreadable"
    if not isinstance(data, dict) or any(key not in data for key in keys):
        return f"{shown} does not hold what geospec wrote"
    if seal_broken(data):
        return f"{shown} was changed after geospec wrote it"
    return None
