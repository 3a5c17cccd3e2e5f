"""Content hashes that let geospec notice an artifact changed behind its back (a damaged token
cache, a checkpoint whose weights were overwritten)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any


def digest(*parts: Any) -> str:
    """A stable hash of JSON-serialisable parts (spec sections, upstream keys): every stage's
    and run's key (:mod:`geospec.pipeline.keys`)."""
    text = json.dumps(parts, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def file_digest(path: Path) -> str:
    """A content hash of a file, read in chunks (token splits and weights can be many GB)."""
    digest = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 24):
            digest.update(chunk)
    return f"blake2b:{digest.hexdigest()}"


#: The key under which a JSON artifact carries the digest of the rest of its content.
SEAL = "digest"


def json_digest(data: Any) -> str:
    """A content hash of JSON-serialisable data (canonical form: sorted keys, no spaces)."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return f"blake2b:{hashlib.blake2b(text.encode(), digest_size=16).hexdigest()}"


def unsealed(data: dict[str, Any]) -> dict[str, Any]:
    """A sealed artifact's content: ``data`` without its digest."""
    return {k: v for k, v in data.items() if k != SEAL}


def sealed(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with the digest of its content added (see :func:`seal_broken`)."""
    content = unsealed(data)
    return {**content, SEAL: json_digest(content)}


def seal_broken(data: dict[str, Any]) -> bool:
    """The content of a sealed artifact changed after geospec wrote it (an artifact written
    before seals existed has none and is not judged)."""
    if SEAL not in data:
        return False
    try:
        return data[SEAL] != json_digest(unsealed(data))
    except ValueError:  # NaN or infinity: geospec never writes them
        return True
