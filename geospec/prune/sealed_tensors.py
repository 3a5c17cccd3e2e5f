"""A prune unit's tensors on disk: a safetensors file sealed by the unit's key and a digest of
every tensor's bytes, read back only when it is whole, unchanged and written for that key
(the unit's ``repair.safetensors``, :mod:`geospec.prune.repair`, and ``cut.safetensors``,
:mod:`geospec.prune.cut`). What is wrong with a file that cannot be trusted is said in words,
so that the prune names it and computes its content again."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch


def save_sealed(path: Path, key: str, tensors: dict[str, torch.Tensor], layers: int) -> None:
    """Write ``tensors`` (of a model of ``layers`` FFN layers) to ``path`` atomically, sealed by
    ``key`` and a digest of every tensor's bytes."""
    from safetensors.torch import save_file

    from geospec.storage.atomic import atomic_path

    found = {name: value.detach().contiguous().cpu() for name, value in tensors.items()}
    metadata = {"key": key, "layers": str(layers), "digest": tensors_digest(found)}
    with atomic_path(path) as work:
        save_file(found, str(work), metadata=metadata)


def load_sealed(
    path: Path, key: str, what: str = "weights"
) -> tuple[tuple[dict[str, torch.Tensor], int] | None, str | None]:
    """The tensors at ``path`` written for ``key`` and their layer count, or None and why they
    cannot be trusted (``what`` names them in the reason); None, None: there is no file."""
    from safetensors import safe_open

    if not path.exists():
        return None, None
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            tensors = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
    except Exception as error:  # a truncated or garbled file: safetensors says what
        return None, f"{path} cannot be read ({type(error).__name__}: {error})"
    if metadata.get("key") != key:
        return None, f"{path} was written for another computation of the unit"
    if metadata.get("digest") != tensors_digest(tensors):
        return None, f"{path}'s {what} changed after geospec wrote them"
    try:
        layers = int(metadata.get("layers", ""))
    except ValueError:
        return None, f"{path} does not say how many layers it holds"
    return (tensors, layers), None


def tensors_digest(tensors: dict[str, torch.Tensor]) -> str:
    """A digest of every tensor's name, dtype, shape and bytes."""
    digest = hashlib.blake2b(digest_size=16)
    for name in sorted(tensors):
        tensor = tensors[name].contiguous()
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes())
    return f"blake2b:{digest.hexdigest()}"
