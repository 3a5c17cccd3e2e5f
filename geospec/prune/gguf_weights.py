"""A GGUF file geospec wrote, read back as the model it ships: its matrices de-quantized by
gguf-py (``gguf.quants.dequantize``, numpy), the query and key rows permuted back from llama.cpp's
rope pairs, copied into the transformers model the file was written from (its true-width
directory, read with :func:`geospec.load_pruned`), so that the file's own weights are scored
where the float32 model was (:func:`shipped_losses`: "What to ship", docs/prune.md).

The names and permutations are the writer's own (:func:`geospec.prune.gguf_export.
gguf_parameters`), read the other way. What this does not see is llama.cpp's arithmetic: it
quantizes the activations to 8 bits per block in each product, which a file's log-probabilities
in llama.cpp show on top of its weights' (docs/prune.md, "GGUF for llama.cpp"). ``gguf`` is
imported only inside the functions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from geospec.errors import UsageError


def load_gguf_weights(model: Any, path: Path) -> None:
    """Copy the de-quantized tensors of the GGUF file ``path`` into ``model`` (a Llama-family
    transformers model of the file's shape, as :func:`geospec.load_pruned` builds it), in place;
    a tensor missing or of another shape is one line naming the file."""
    import gguf

    from geospec.prune.gguf_export import gguf_parameters, unpermute

    stored = {tensor.name: tensor for tensor in gguf.GGUFReader(str(path)).tensors}
    with torch.no_grad():
        for name, parameter, heads in gguf_parameters(model):
            tensor = stored.get(name)
            if tensor is None:
                raise UsageError(f"{path}: no tensor {name}; not the file of this model")
            values = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
            values = values.reshape(tuple(reversed([int(n) for n in tensor.shape])))
            if tuple(values.shape) != tuple(parameter.shape):
                raise UsageError(
                    f"{path}: {name} has shape {tuple(values.shape)}, the model's "
                    f"{tuple(parameter.shape)}; not the file of this model"
                )
            if heads:
                values = unpermute(values, heads)
            parameter.copy_(torch.from_numpy(np.ascontiguousarray(values)))


def shipped_model(model_dir: Path, path: Path, device: str = "cpu") -> Any:
    """The model in ``model_dir`` (float32, on ``device``) holding the GGUF file ``path``'s
    de-quantized weights: the model the file ships."""
    from geospec.prune.true_width import load_pruned

    model = load_pruned(model_dir, dtype=torch.float32, device=device)
    load_gguf_weights(model, path)
    return model


def shipped_losses(model_dir: Path, path: Path, batches: Sequence[Any]) -> dict[str, float]:
    """The mean loss on ``batches`` of the model in ``model_dir`` (its exported weights, in
    float32) and of the same model holding the GGUF file ``path``'s de-quantized weights:
    ``{"windows": ..., "float32": ..., "shipped": ...}``, the losses in nats."""
    from geospec.prune.losses import eval_loss
    from geospec.prune.true_width import load_pruned

    model = load_pruned(model_dir, dtype=torch.float32, device=_device(batches))
    float32 = eval_loss(model, batches)
    load_gguf_weights(model, path)  # the same model, the file's weights in place
    shipped = eval_loss(model, batches)
    windows = sum(int(inputs.shape[0]) for inputs, _ in batches)
    return {"windows": windows, "float32": float32, "shipped": shipped}


def shipped_corpus_losses(
    model_dir: Path,
    path: Path,
    corpora: Mapping[str, Sequence[Any]],
    beside: Sequence[Any] | None = None,
) -> tuple[dict[str, float], dict[str, float] | None]:
    """Each corpus's mean loss (its batches') of the model the GGUF file ``path`` ships, its
    de-quantized weights in the model in ``model_dir`` (``geospec heal --format gguf``: what the
    healing is worth in the file); with ``beside`` (more batches), their loss by the float32
    model and by the file, as :func:`shipped_losses` gives it. The model is read and the file
    de-quantized once."""
    from geospec.prune.losses import eval_loss
    from geospec.prune.true_width import load_pruned

    first = beside if beside is not None else next(iter(corpora.values()), [])
    model = load_pruned(model_dir, dtype=torch.float32, device=_device(first))
    float32 = {} if beside is None else {"float32": eval_loss(model, beside)}
    load_gguf_weights(model, path)  # the same model, the file's weights in place
    losses = {name: eval_loss(model, batches) for name, batches in corpora.items()}
    if beside is None:
        return losses, None
    return losses, {**float32, "shipped": eval_loss(model, beside)}


def shipped_window_losses(model_dir: Path, path: Path, batches: Sequence[Any]) -> list[float]:
    """Each window's loss of the model the GGUF file ``path`` ships (prune.select.shipped)."""
    from geospec.prune.losses import window_losses

    return window_losses(shipped_model(model_dir, path, _device(batches)), batches)


def _device(batches: Sequence[Any]) -> str:
    return str(batches[0][0].device) if batches else "cpu"
