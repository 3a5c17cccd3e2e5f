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

Bias compensation (``prune.compensate = "mean"``, FLAP's): the calibration pass records every
neuron's signed mean activation (:func:`calibration_stats`), and each cut layer's output
projection gains the bias sum over its removed neurons j of mean_j x W_out[:, j]
(:func:`geospec.measure.cut.cut_modules`), so the pruned model computes what the full model
computes with each removed neuron's activation replaced by its calibration mean. The export
carries that bias: GPT-2's ``c_proj`` has one already; a Llama-family config is exported with
``mlp_bias = True`` (zero gate and up biases; a layer that kept every neuron gets a zero down
bias). Other configs have no MLP bias to carry it (:func:`compensated_export_problem`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from geospec.errors import UsageError
from geospec.kinds import ActivationStats, Importance
from geospec.measure.calibration import calibration_stats
from geospec.measure.cut import (
    checked_scores,
    ffn_cut,
    ffn_layout,
    kept_neurons,
    neuron_weights,
    order_of,
)
from geospec.measure.probe import FFNSite
from geospec.measure.sensitivity import Batch, logits_of, mean_loss
from geospec.prune.true_width import Stored
from geospec.version import __version__

if TYPE_CHECKING:
    from geospec.prune.repair import Moments, Refit


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
    stats: Sequence[ActivationStats] | None = None,
    bos: int | None = None,
    moments: Sequence[Moments] | None = None,
    advance: Callable[[], None] | None = None,
) -> tuple[list[list[float]], list[list[int]]]:
    """Every layer's neuron scores by ``importance`` and the orderings they give (``advance``
    called after each layer's: OBS takes a minute a layer on a 4,864-wide FFN). An importance
    that needs activations gets ``stats`` (from :func:`calibration_stats`), or, when they are
    not given, the statistics of a calibration pass over the windows at ``starts``; ``stats``
    given to an importance that needs none are not shown to it. One that needs second moments
    gets ``moments`` (:func:`geospec.prune.repair.calibration_moments`), or those of a pass over
    the same windows."""
    layers: list[ActivationStats | None] = [None] * len(sites)
    needs = importance.needs_activations or importance.needs_second_moments
    if needs:
        if stats is None:
            stats = calibration_stats(model, sites, tokens, starts, seq_len, batch_size, bos)
        if len(stats) != len(sites):
            raise ValueError(f"statistics of {len(stats)} layers for {len(sites)} FFNs")
        layers = list(stats)
    seconds: list[torch.Tensor | None] = [None] * len(sites)
    if importance.needs_second_moments:
        if moments is None:
            from geospec.prune.repair import calibration_moments, window_batches

            device = next(model.parameters()).device
            batches = window_batches(tokens, starts, seq_len, batch_size, device, bos)
            moments = calibration_moments(model, sites, batches)
        seconds = [m.second for m in moments]
    views = [
        neuron_weights(site.ffn, layer, stats=layers[layer], second_moment=seconds[layer])
        for layer, site in enumerate(sites)
    ]
    checked = []
    for view in views:  # each plugin call once
        checked.append(checked_scores(importance, view))
        if advance is not None:
            advance()
    return [s.tolist() for s in checked], [order_of(s) for s in checked]


@contextmanager
def pruned(
    sites: Sequence[FFNSite],
    orders: Sequence[Sequence[int]],
    widths: Sequence[int],
    compensation: Sequence[torch.Tensor] | None = None,
    refits: Sequence[Refit | None] | None = None,
) -> Iterator[None]:
    """Inside the block, layer l keeps the ``widths[l]`` best neurons of ``orders[l]``; with
    ``compensation`` (one (width,) tensor per layer, the full layer's signed calibration means
    ``[s.mean for s in calibration_stats(...)]``), each cut layer's output projection gains the
    bias that puts each removed neuron's mean in place of its activation (module docstring);
    with ``refits`` (:mod:`geospec.prune.repair`: one per layer, None where a layer is only
    cut), each layer's output projection is re-fitted instead."""
    for name, given in (("compensation", compensation), ("refits", refits)):
        if given is not None and len(given) != len(sites):
            raise ValueError(f"{name} for {len(given)} layers, {len(sites)} FFNs")
    with ExitStack() as stack:
        for layer, (site, order, width) in enumerate(zip(sites, orders, widths, strict=True)):
            means = None if compensation is None else compensation[layer]
            found = None if refits is None else refits[layer]
            stack.enter_context(ffn_cut(site.ffn, kept_neurons(order, width), means, found))
        yield


def eval_loss(model: nn.Module, batches: Sequence[Batch]) -> float:
    """Mean next-token cross-entropy over ``batches`` (its exp is the perplexity)."""
    return mean_loss(model, batches)


def window_losses(model: nn.Module, batches: Sequence[Batch]) -> list[float]:
    """Each window's mean next-token cross-entropy, in the windows' order (every window scores
    as many tokens, so their mean is :func:`eval_loss`): what a bootstrap over the eval windows
    resamples."""
    import torch.nn.functional as F

    found: list[float] = []
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for inputs, targets in batches:
                logits = logits_of(model, inputs)
                per_token = F.cross_entropy(
                    logits.flatten(0, 1).float(), targets.flatten(), reduction="none"
                )
                found.extend(per_token.double().view(targets.shape).mean(dim=1).tolist())
    finally:
        model.train(was_training)
    return found


def ffn_parameters(sites: Sequence[FFNSite]) -> int:
    """Parameters of every FFN as it is now (cut or not)."""
    return sum(p.numel() for site in sites for p in site.ffn.parameters())


def compensated_export_problem(model: nn.Module) -> str | None:
    """Why a compensated pruning of ``model`` cannot be exported as a transformers checkpoint of
    its own family (None: it can): the family's MLP must hold a bias on its output projection
    (GPT-2's ``c_proj``; a config with ``mlp_bias``, as Llama's)."""
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


def compensation_biases(model: nn.Module, sites: Sequence[FFNSite]) -> dict[str, torch.Tensor]:
    """The zero biases a compensated Llama-family export adds (gate, up, and the down projection
    of a layer that kept every neuron), by state-dict key, so that its config can say
    ``mlp_bias = True``; empty when no output projection carries a bias the config lacks (an
    uncompensated cut, GPT-2's c_proj). A family without an MLP bias is a :class:`UsageError`."""
    config: Any = model.config
    biased = [
        getattr(site.ffn, ffn_layout(site.ffn).output).bias is not None
        for site in sites
        if not ffn_layout(site.ffn).transposed  # GPT-2's c_proj always has its bias
    ]
    if not any(biased) or getattr(config, "mlp_bias", False):
        return {}
    problem = compensated_export_problem(model)
    if problem is not None:
        raise UsageError(
            f"prune.export: the pruned model's FFN output projections carry a bias "
            f"(prune.repair) but {problem}; re-fit without one (prune.lstsq = {{ intercept = "
            'false }), or set prune.repair = "none" or prune.export = false'
        )
    names = {id(module): name for name, module in model.named_modules()}
    zeros = {}
    for site in sites:
        prefix = names[id(site.ffn)]
        for name, module in site.ffn.named_children():
            weight = getattr(module, "weight", None)
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
    is a :class:`UsageError` (:func:`compensated_export_problem`). ``dtype`` ("bfloat16", ...):
    the weights' (None: the model's own)."""
    from transformers import AutoModelForCausalLM

    from geospec.prune.true_width import (
        export_config,
        parameter_counts,
        save_true_width,
        width_key,
    )
    from geospec.storage.atomic import atomic_directory, check_new_directory

    check_new_directory(directory, str(directory))
    zero_biases = compensation_biases(model, sites)
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
