"""A pruned model written as a transformers checkpoint: at its true per-layer widths
(:mod:`geospec.prune.true_width`; read back with :func:`geospec.load_pruned`) or padded.

Transformers' configs hold one FFN width for every layer, so for tools that need one
``intermediate_size`` the padded export pads each layer with zero neurons up to the widest pruned
layer (a zero row of the gate, up or input projection and a zero column of the output projection
contribute exactly nothing: the exported model computes what the pruned one does); it loads with
``AutoModelForCausalLM.from_pretrained`` and no remote code, but stores and computes the padding.
Both record the true widths in ``config.json`` (``geospec.ffn_widths``, as ``geospec export``
does).

A repair's bias is carried (mean compensation, :mod:`geospec.prune.cut`; the least-squares
re-fit's intercept, :mod:`geospec.prune.repair`): GPT-2's ``c_proj`` has one already; a
Llama-family config is exported with ``mlp_bias = True`` (zero gate and up biases; a layer that
kept every neuron gets a zero down bias). Other configs (Qwen2's, Mistral's, Gemma's) have no
MLP bias (:func:`compensated_export_problem`): at the true widths the output projection's bias
is stored as it is (a zero one where a layer kept every neuron), which
:func:`geospec.load_pruned` gives back to each layer's output projection (and the GGUF writer
writes as llama.cpp's ``ffn_down.bias``); the padded checkpoint, which plain
``AutoModelForCausalLM.from_pretrained`` reads and would drop that bias, is refused in one line.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from geospec.errors import UsageError
from geospec.measure.cut import ffn_layout
from geospec.measure.probe import FFNSite
from geospec.prune.true_width import Stored
from geospec.version import __version__


def compensated_export_problem(model: nn.Module) -> str | None:
    """Why a compensated pruning of ``model`` cannot be exported as a checkpoint its own family's
    transformers class reads (None: it can): the family's MLP must hold a bias on its output
    projection (GPT-2's ``c_proj``; a config with ``mlp_bias``, as Llama's). Only the padded
    export needs that; the true-width one and the GGUF file carry the bias for any family."""
    config: Any = getattr(model, "config", None)
    if config is None:
        return f"{type(model).__name__} is not a transformers model"
    if hasattr(config, "mlp_bias") or getattr(config, "model_type", None) == "gpt2":
        return None
    # Qwen2, Mistral, Gemma 2: their MLP builds gate, up and down without a bias whatever the
    # config says, so a saved down-projection bias would be dropped on load (wrong logits)
    return (
        f"transformers' {getattr(config, 'model_type', type(config).__name__)} MLP has no bias "
        "to carry the compensation (its config has no mlp_bias, as Llama's has; GPT-2's c_proj "
        "has a bias)"
    )


def compensation_biases(
    model: nn.Module, sites: Sequence[FFNSite], padded: bool = False
) -> dict[str, torch.Tensor]:
    """The zero biases a compensated export adds, by state-dict key, so that every layer's FFN
    holds the same biases: for a Llama-family config (its config then says ``mlp_bias =
    True``) the gate, up, and down projection's of a layer that kept every neuron; for a family
    without an MLP bias (Qwen2, Mistral, Gemma) at the true widths, the down projection's alone
    (:func:`geospec.load_pruned` gives each output projection its stored bias). Empty when no
    output projection carries a bias the config lacks (an uncompensated cut, GPT-2's c_proj).
    ``padded`` for a family without an MLP bias is a :class:`UsageError`: transformers would
    build its MLP without the bias and drop it on load."""
    config: Any = model.config
    biased = [
        getattr(site.ffn, ffn_layout(site.ffn).output).bias is not None
        for site in sites
        if not ffn_layout(site.ffn).transposed  # GPT-2's c_proj always has its bias
    ]
    if not any(biased) or getattr(config, "mlp_bias", False):
        return {}
    problem = compensated_export_problem(model)
    if problem is not None and padded:
        raise UsageError(
            "a padded export (--padded): the pruned model's FFN output projections carry a "
            f"bias (prune.repair) but {problem}, so AutoModelForCausalLM would drop it; export "
            "it at its true widths (leave --padded out: geospec.load_pruned reads it) or as "
            "GGUF (--format gguf), or re-fit without an intercept (prune.lstsq = { intercept = "
            "false })"
        )
    names = {id(module): name for name, module in model.named_modules()}
    zeros = {}
    for site in sites:
        prefix = names[id(site.ffn)]
        output = ffn_layout(site.ffn).output
        for name, module in site.ffn.named_children():
            weight = getattr(module, "weight", None)
            if problem is not None and name != output:
                continue  # no gate or up bias where the family's MLP has no bias option
            if isinstance(weight, torch.Tensor) and getattr(module, "bias", None) is None:
                zeros[f"{prefix}.{name}.bias"] = weight.new_zeros(weight.shape[0]).detach()
    return zeros


def export_pruned(
    model: nn.Module,
    sites: Sequence[FFNSite],
    widths: Sequence[int],
    directory: Path,
    padded: bool = False,
    dtype: str | None = None,
) -> Stored:
    """Save the (currently pruned) Hugging Face ``model`` to the new ``directory``, atomically (a
    staging directory renamed into place), the true widths in ``config.json``'s geospec block.

    ``padded=False`` (the default): every layer's FFN at its true width, read back by
    :func:`geospec.load_pruned`. ``padded=True``: every FFN zero-padded to the widest layer, for
    tools that need one ``intermediate_size`` (``AutoModelForCausalLM.from_pretrained``); the
    returned :class:`Stored`'s ``note`` says what the padding costs. A bias the cut gave an
    output projection (compensation) is carried: a Llama-family config is saved with
    ``mlp_bias = True`` and zero biases where the model has none; a config without an MLP bias
    stores the output projections' biases at the true widths (:func:`compensation_biases`) and
    is a :class:`UsageError` padded (:func:`compensated_export_problem`). ``dtype``
    ("bfloat16", ...): the weights' (None: the model's own)."""
    from transformers import AutoModelForCausalLM

    from geospec.prune.true_width import (
        export_config,
        parameter_counts,
        save_true_width,
        width_key,
    )
    from geospec.storage.atomic import atomic_directory, check_new_directory

    check_new_directory(directory, str(directory))
    zero_biases = compensation_biases(model, sites, padded)
    if not padded:
        note = "pruned by geospec prune; FFN layers stored at their true widths (load with "
        note += "geospec.load_pruned)"
        stored = None if dtype is None else getattr(torch, dtype)
        return save_true_width(model, widths, directory, note, zero_biases, stored)
    true, padded_parameters = parameter_counts(model, widths)
    config = export_config(model)
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
    if zero_biases:
        config.mlp_bias = True  # transformers' Llama: a bias on gate, up and down
        state |= zero_biases
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
    weights = next(model.parameters()).dtype if dtype is None else getattr(torch, dtype)
    exported = AutoModelForCausalLM.from_config(config, dtype=weights)
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
