"""Content hashes that let geospec notice an artifact changed behind its back (a damaged token
cache, a checkpoint whose weights were overwritten)."""

from __future__ import annotations

import hashlib
from pathlib import Path


def file_digest(path: Path) -> str:
    """A content hash of a file, read in chunks (token splits and weights can be many GB)."""
    digest = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 24):
            digest.update(chunk)
    return f"blake2b:{digest.hexdigest()}"
