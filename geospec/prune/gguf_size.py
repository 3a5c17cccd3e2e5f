"""A GGUF export's size against what the user started from: the source checkpoint's file (a GGUF
file, or a directory's safetensors), and, as secondary information, an f16 file of the same
model. What ``geospec export`` prints and what a summary of what to ship can call; torch-free
(``gguf`` imported inside)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from geospec.storage.disk import size


@dataclass(frozen=True)
class GGUFSize:
    """A GGUF file's bytes beside its source's and an f16 file's of the same tensors."""

    bytes: int
    f16_bytes: int
    """What the writer's f16 file of the same model takes: the same metadata, matrices in f16."""
    source_bytes: int | None = None
    source_type: str | None = None
    """The source's weight type in words (Q4_1, "bfloat16 safetensors"), where it says."""

    @property
    def ratio(self) -> float | None:
        """The file's size over its source's (None without a source)."""
        return None if not self.source_bytes else self.bytes / self.source_bytes

    def line(self) -> str:
        """``69.5 MiB, 0.74x the source's 93.8 MiB (Q4_1); f16: 181.5 MiB``."""
        against = ""
        if self.ratio is not None and self.source_bytes is not None:
            kind = f" ({self.source_type})" if self.source_type else ""
            against = f", {self.ratio:.2f}x the source's {size(self.source_bytes)}{kind}"
        return f"{size(self.bytes)}{against}; f16: {size(self.f16_bytes)}"


def gguf_size(path: Path, source: Path | None = None) -> GGUFSize:
    """The GGUF file ``path``'s size against ``source`` (the checkpoint it was pruned from: a
    .gguf file, or a directory whose ``*.safetensors`` are summed; None or anything else: no
    comparison) and against the f16 file of the same tensors."""
    from geospec.prune.gguf_quant import source_type

    source_bytes, kind = None, None
    if source is not None and source.is_file() and source.suffix == ".gguf":
        source_bytes, kind = source.stat().st_size, source_type(source).label
    elif source is not None and source.is_dir():
        weights = sorted(source.glob("*.safetensors"))
        if weights:
            source_bytes = sum(file.stat().st_size for file in weights)
            kind = f"{_declared_dtype(source) or ''} safetensors".strip()
    return GGUFSize(path.stat().st_size, f16_bytes(path), source_bytes, kind)


def f16_bytes(path: Path) -> int:
    """The bytes of the f16 file of the GGUF file ``path``'s tensors, as the writer lays it out:
    the same metadata (types and offsets are fixed-width fields) less the quantization version
    that only a quantized file holds, vectors in f32 and matrices in f16, each padded to the
    file's alignment."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    align = reader.alignment

    def padded(count: int) -> int:
        return -(-count // align) * align

    def length(field: Any) -> int:
        return int(field.offset) + sum(int(part.nbytes) for part in field.parts)

    fields = [*reader.fields.values(), *(tensor.field for tensor in reader.tensors)]
    metadata = max(length(field) for field in fields)
    version = reader.fields.get("general.quantization_version")
    if version is not None:
        metadata -= length(version) - int(version.offset)
    return padded(metadata) + sum(
        padded(int(t.n_elements) * (4 if len(t.shape) == 1 else 2)) for t in reader.tensors
    )


def _declared_dtype(directory: Path) -> str | None:
    """The dtype a checkpoint directory's config.json declares (transformers 5's ``dtype``,
    4.x's ``torch_dtype``)."""
    try:
        config = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError):
        return None
    declared = config.get("dtype") or config.get("torch_dtype")
    return declared if isinstance(declared, str) else None
