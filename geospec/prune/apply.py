"""Pruning applied: calibration scores, every layer cut to its width, held-out losses, and the
pruned model exported as a transformers checkpoint.

A pruned model is the reference with layer l keeping the ``widths[l]`` best neurons of its
ordering (:mod:`geospec.measure.cut`: rows and columns removed exactly). The export stores it at
its true per-layer widths by default (:mod:`geospec.prune.true_width`; read back with
:func:`geospec.load_pruned`). Transformers' configs hold one FFN width for every layer, so for
tools that need one ``intermediate_size`` the padded export pads each layer with zero neurons up
to the widest pruned layer (a zero row of the gate, up or input projection and a zero column of
the output projection contribute exactly nothing: the exported model computes what the pruned one
does); it loads with ``AutoModelForCausalLM.from_pretrained`` and no remote code, but stores and
computes the padding. Both record the true widths in ``config.json`` (``geospec.ffn_widths``, as
``geospec export`` does).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from geospec.errors import UsageError
from geospec.kinds import Importance
from geospec.measure.cut import (
    checked_scores,
    ffn_cut,
    ffn_layout,
    hidden_activations,
    kept_neurons,
    neuron_weights,
    order_of,
)
from geospec.measure.probe import FFNSite
from geospec.measure.sensitivity import Batch, logits_of, mean_loss
from geospec.prune.true_width import Stored
from geospec.version import __version__


def calibration_windows(tokens: np.ndarray, seq_len: int, windows: int, seed: int) -> np.ndarray:
    """Start offsets of ``windows`` non-overlapping windows of ``seq_len`` tokens drawn from
    ``tokens`` with ``seed`` (calibration sample ``seed``)."""
    available = len(tokens) // seq_len
    if windows > available:
        raise UsageError(
            f"prune.calibration.windows {windows} exceeds the {available} training windows of "
            f"{seq_len} tokens; lower it or use more data"
        )
    drawn = np.random.default_rng(seed).choice(available, size=windows, replace=False)
    return np.sort(drawn) * seq_len


def neuron_scores(
    model: nn.Module,
    sites: Sequence[FFNSite],
    importance: Importance,
    tokens: np.ndarray,
    starts: np.ndarray,
    seq_len: int,
    batch_size: int,
) -> tuple[list[list[float]], list[list[int]]]:
    """Every layer's neuron scores by ``importance`` (calibration activations over the windows at
    ``starts`` when it needs them) and the orderings they give."""
    activations: list[Any] = [None] * len(sites)
    if importance.needs_activations:
        device = next(model.parameters()).device
        ids = np.stack([tokens[s : s + seq_len].astype(np.int64) for s in starts])
        with torch.no_grad(), hidden_activations([site.ffn for site in sites]) as means:
            for start in range(0, len(ids), batch_size):
                logits_of(model, torch.as_tensor(ids[start : start + batch_size], device=device))
            activations = means()
    views = [
        neuron_weights(site.ffn, layer, activations[layer]) for layer, site in enumerate(sites)
    ]
    checked = [checked_scores(importance, view) for view in views]  # each plugin call once
    return [s.tolist() for s in checked], [order_of(s) for s in checked]


@contextmanager
def pruned(
    sites: Sequence[FFNSite], orders: Sequence[Sequence[int]], widths: Sequence[int]
) -> Iterator[None]:
    """Inside the block, layer l keeps the ``widths[l]`` best neurons of ``orders[l]``."""
    with ExitStack() as stack:
        for site, order, width in zip(sites, orders, widths, strict=True):
            stack.enter_context(ffn_cut(site.ffn, kept_neurons(order, width)))
        yield


def eval_loss(model: nn.Module, batches: Sequence[Batch]) -> float:
    """Mean next-token cross-entropy over ``batches`` (its exp is the perplexity)."""
    return mean_loss(model, batches)


def ffn_parameters(sites: Sequence[FFNSite]) -> int:
    """Parameters of every FFN as it is now (cut or not)."""
    return sum(p.numel() for site in sites for p in site.ffn.parameters())


def export_pruned(
    model: nn.Module,
    sites: Sequence[FFNSite],
    widths: Sequence[int],
    directory: Path,
    padded: bool = False,
) -> Stored:
    """Save the (currently pruned) Hugging Face ``model`` to the new ``directory``, atomically (a
    staging directory renamed into place), the true widths in ``config.json``'s geospec block.

    ``padded=False`` (the default): every layer's FFN at its true width, read back by
    :func:`geospec.load_pruned`. ``padded=True``: every FFN zero-padded to the widest layer, for
    tools that need one ``intermediate_size`` (``AutoModelForCausalLM.from_pretrained``); the
    returned :class:`Stored`'s ``note`` says what the padding costs."""
    from transformers import AutoModelForCausalLM

    from geospec.atomic import atomic_directory
    from geospec.prune.true_width import parameter_counts, save_true_width, width_key

    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        raise UsageError(f"{directory}: already exists and is not empty; give a new directory")
    if not padded:
        note = "pruned by geospec prune; FFN layers stored at their true widths (load with "
        note += "geospec.load_pruned)"
        return save_true_width(model, widths, directory, note)
    true, padded_parameters = parameter_counts(model, widths)
    original: Any = model.config
    config = type(original).from_dict(original.to_dict())
    padded_width = max(widths)
    setattr(config, width_key(config), padded_width)
    config.geospec = {  # as geospec export records a trained model's widths
        "version": __version__,
        "ffn_widths": [int(w) for w in widths],
        "padded_to": padded_width if len(set(widths)) > 1 else None,
        "note": "pruned by geospec prune; FFN layers zero-padded to one width: the padded units "
        "contribute exactly zero, but this checkpoint's parameter count and FLOPs overstate the "
        "model's",
    }
    names = {id(module): name for name, module in model.named_modules()}
    state = {key: value.detach().clone() for key, value in model.state_dict().items()}
    for site, width in zip(sites, widths, strict=True):
        layout = ffn_layout(site.ffn)
        prefix = names[id(site.ffn)]
        extra = padded_width - width
        if extra == 0:
            continue
        for name in layout.inputs:
            key = f"{prefix}.{name}"
            axis = 1 if layout.transposed else 0  # Conv1D stores in x out
            state[f"{key}.weight"] = _pad(state[f"{key}.weight"], axis, extra)
            if f"{key}.bias" in state:
                state[f"{key}.bias"] = _pad(state[f"{key}.bias"], 0, extra)
        key = f"{prefix}.{layout.output}.weight"
        state[key] = _pad(state[key], 0 if layout.transposed else 1, extra)
    exported = AutoModelForCausalLM.from_config(config, dtype=next(model.parameters()).dtype)
    missing, unexpected = exported.load_state_dict(state, strict=False)
    tied = {k for k in missing if "lm_head" in k} if config.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise RuntimeError(f"export: missing {sorted(missing)}, unexpected {sorted(unexpected)}")
    exported.tie_weights()
    with atomic_directory(directory) as work:
        exported.save_pretrained(work)
    stored = sum(p.numel() for p in exported.parameters())
    return Stored(
        directory, [int(w) for w in widths], padded_width, stored, true, padded_parameters
    )


def _pad(tensor: torch.Tensor, axis: int, extra: int) -> torch.Tensor:
    shape = list(tensor.shape)
    shape[axis] = extra
    return torch.cat([tensor, tensor.new_zeros(shape)], dim=axis)
