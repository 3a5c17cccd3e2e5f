"""Probing: capture, for every decoder layer, the token cloud before and after its FFN sub-layer.

Layers and their FFNs are found structurally, so the same code serves geospec's own model and
Hugging Face causal LMs (GPT-2, Llama, Mistral, Gemma, Qwen, ...):

- the decoder layers are the longest ``nn.ModuleList`` whose entries all share one class;
- in a pre-norm decoder layer, the FFN (MLP) is the last direct child that is called and is not a
  norm, and its pre-norm is the last norm called before it (found by recording the call order of the
  layer's children during one forward pass). A norm is a leaf module whose parameters are all
  vectors of the model width.

Sites: ``residual`` captures the residual stream entering the FFN's pre-norm (x) and the layer's
output (y), so y - x is exactly the FFN sub-layer's contribution (including a post-FFN norm where
the architecture has one, as Gemma does). ``ffn`` captures the normalised FFN input and the FFN
output. Only the sampled token positions are kept, so memory is bounded by ``tokens x layers``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from geospec.engine.batches import with_bos
from geospec.engine.distributed import DistContext, spread_over_ranks
from geospec.errors import GeospecError


class ProbeError(GeospecError):
    """The model's structure cannot be mapped, or the data cannot supply the requested tokens."""


@dataclass(frozen=True)
class FFNSite:
    """Where one decoder layer's FFN sits: the layer, its FFN module and the FFN's pre-norm."""

    layer: nn.Module
    ffn: nn.Module
    pre_norm: nn.Module


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The model's stack of decoder layers: the longest ModuleList of same-class modules."""
    best: nn.ModuleList | None = None
    for module in model.modules():
        if not isinstance(module, nn.ModuleList) or len(module) == 0:
            continue
        if len({type(child) for child in module}) != 1:
            continue
        if best is None or len(module) > len(best):
            best = module
    if best is None:
        raise ProbeError(
            f"cannot find the decoder layers of {type(model).__name__}: no nn.ModuleList of "
            "identical blocks; geospec probes decoder-only transformers (GPT-2, Llama, Mistral, "
            "Gemma, Qwen families and geospec's own model)"
        )
    return best


def is_norm(module: nn.Module, width: int) -> bool:
    """A leaf module whose parameters are all vectors of the model width (LayerNorm, RMSNorm)."""
    params = list(module.parameters(recurse=False))
    if list(module.children()) or not params:
        return False
    return all(p.dim() == 1 and p.shape[0] == width for p in params)


def call_order(layer: nn.Module, run_forward: Callable[[], Any]) -> list[nn.Module]:
    """The direct children of ``layer`` in the order one forward pass calls them."""
    order: list[nn.Module] = []
    handles = [
        child.register_forward_pre_hook(lambda module, args: order.append(module))
        for child in layer.children()
    ]
    try:
        with torch.no_grad():
            run_forward()
    finally:
        for handle in handles:
            handle.remove()
    return order


def find_ffn_sites(model: nn.Module, width: int, run_forward: Callable[[], Any]) -> list[FFNSite]:
    """Locate every layer's FFN and pre-norm (see the module docstring for the rules)."""
    layers = decoder_layers(model)
    order = call_order(layers[0], run_forward)
    name = type(layers[0]).__name__
    compute = [m for m in order if not is_norm(m, width)]
    if len(compute) < 2:
        raise ProbeError(
            f"cannot map {name}: expected an attention and an FFN sub-module, found "
            f"{[type(m).__name__ for m in compute]}"
        )
    ffn = compute[-1]
    position = max(i for i, m in enumerate(order) if m is ffn)
    norms_before = [m for m in order[:position] if is_norm(m, width)]
    if not norms_before:
        raise ProbeError(
            f"cannot map {name}: no norm before its FFN (post-norm layers unsupported)"
        )
    pre_norm = norms_before[-1]
    if order.index(pre_norm) < order.index(compute[0]):
        raise ProbeError(
            f"cannot map {name}: attention and FFN share one norm (a parallel block, as in GPT-J); "
            "the FFN's own contribution to the residual stream is not separable"
        )
    ffn_name = _child_name(layers[0], ffn)
    norm_name = _child_name(layers[0], pre_norm)
    sites = []
    for layer in layers:
        sites.append(FFNSite(layer, layer.get_submodule(ffn_name), layer.get_submodule(norm_name)))
    return sites


def _child_name(parent: nn.Module, child: nn.Module) -> str:
    return next(name for name, module in parent.named_children() if module is child)


@dataclass(frozen=True)
class TokenSample:
    """Which tokens are probed: ``windows[s]`` is a start offset into the token stream; token j of
    the cloud is position ``positions[j]`` of window ``window_index[j]``."""

    windows: np.ndarray
    window_index: np.ndarray
    positions: np.ndarray


def sample_tokens(
    tokens: np.ndarray,
    seq_len: int,
    n_tokens: int,
    seed: int,
    sequences: int | None = None,
    skip_first: int = 0,
    skip_ids: Sequence[int] = (),
    replicates: int = 1,
    split: str = "validation",
) -> TokenSample:
    """Deterministically choose ``n_tokens`` token positions from non-overlapping windows.

    Windows of ``seq_len`` tokens are drawn without overlap from ``tokens`` (the ``split`` its
    messages name: the validation split, or the training split in a prune);
    positions before ``skip_first`` and tokens in ``skip_ids`` (special tokens) are never chosen.
    By default about a quarter of each window's eligible positions are used, so clouds span many
    contexts.

    With ``replicates`` R > 1 it draws R disjoint samples of ``n_tokens`` positions, each from its
    own ``sequences`` windows (R x ``sequences`` windows drawn at once, without overlap), one
    after the other in the result: token j belongs to replicate j // n_tokens. R = 1 is the single
    sample, drawn exactly as before replicates existed.
    """
    if skip_first >= seq_len:
        raise ProbeError(f"probe.skip_first {skip_first} leaves no positions in seq_len {seq_len}")
    available = len(tokens) // seq_len
    per_window = seq_len - skip_first
    if sequences is None:
        sequences = min(available // replicates, max(1, math.ceil(4 * n_tokens / per_window)))
    if sequences * replicates > available or sequences == 0:
        wanted = (
            f"probe.sequences {sequences}"
            if replicates == 1
            else (f"probe.replicates {replicates} x {max(sequences, 1)} windows")
        )
        raise ProbeError(
            f"{wanted} exceeds the {available} {split} windows of {seq_len} "
            "tokens; lower it or use more data"
        )
    rng = np.random.default_rng(seed)
    drawn = rng.choice(available, size=sequences * replicates, replace=False)
    windows, window_index, positions = [], [], []
    for replicate in range(replicates):
        own = np.sort(drawn[replicate * sequences : (replicate + 1) * sequences]) * seq_len
        grid = own[:, None] + np.arange(seq_len)[None, :]
        eligible = np.ones((sequences, seq_len), dtype=bool)
        eligible[:, :skip_first] = False
        if len(skip_ids):
            eligible &= ~np.isin(tokens[grid], np.asarray(skip_ids))
        candidates = np.flatnonzero(eligible)
        if len(candidates) < n_tokens:
            raise ProbeError(
                f"probe.tokens {n_tokens} exceeds the {len(candidates)} eligible tokens in "
                f"{sequences} windows; raise probe.sequences or lower probe.tokens"
            )
        chosen = np.sort(rng.choice(candidates, size=n_tokens, replace=False))
        windows.append(own)
        window_index.append(chosen // seq_len + replicate * sequences)
        positions.append(chosen % seq_len)
    return TokenSample(
        np.concatenate(windows), np.concatenate(window_index), np.concatenate(positions)
    )


#: One batch's capture: per layer, the states the hooks kept of its tokens, before and after.
Captured = tuple[list[list[torch.Tensor]], list[list[torch.Tensor]]]


@contextmanager
def _capture(
    sites: Sequence[FFNSite], site: str, select: Callable[[torch.Tensor], torch.Tensor]
) -> Iterator[tuple[list[list[torch.Tensor]], list[list[torch.Tensor]]]]:
    xs: list[list[torch.Tensor]] = [[] for _ in sites]
    ys: list[list[torch.Tensor]] = [[] for _ in sites]

    def keep(store: list[torch.Tensor], value: Any) -> None:
        tensor = value[0] if isinstance(value, tuple) else value
        store.append(select(tensor).detach().to(torch.float32).cpu())

    # Hooks must return None: a forward hook's return value would replace the module's output.
    def keep_input(i: int) -> Callable[..., None]:
        return lambda module, args: keep(xs[i], args[0])

    def keep_output(i: int) -> Callable[..., None]:
        return lambda module, args, out: keep(ys[i], out)

    def keep_both(i: int) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[Any, ...], out: Any) -> None:
            keep(xs[i], args[0])
            keep(ys[i], out)

        return hook

    handles = []
    for i, s in enumerate(sites):
        if site == "residual":
            handles.append(s.pre_norm.register_forward_pre_hook(keep_input(i)))
            handles.append(s.layer.register_forward_hook(keep_output(i)))
        else:
            handles.append(s.ffn.register_forward_hook(keep_both(i)))
    try:
        yield xs, ys
    finally:
        for handle in handles:
            handle.remove()


def sample_windows(
    tokens: np.ndarray, sample: TokenSample, seq_len: int, bos: int | None = None
) -> torch.Tensor:
    """The sampled windows as the model reads them (windows x tokens, int64 on the CPU): each
    window's ``seq_len`` tokens, after ``bos`` when the tokenizer has one (:func:`probe_clouds`,
    and the demand stage's calibration on the same windows)."""
    read = np.stack([tokens[w : w + seq_len].astype(np.int64) for w in sample.windows])
    return with_bos(torch.as_tensor(read), bos)


def probe_clouds(
    model: nn.Module,
    tokens: np.ndarray,
    sample: TokenSample,
    seq_len: int,
    width: int,
    site: str = "residual",
    batch_size: int = 8,
    forward: Callable[[nn.Module, torch.Tensor], Any] | None = None,
    progress: Callable[[int], None] | None = None,
    dist: DistContext | None = None,
    bos: int | None = None,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Run the model over the sampled windows and return one (x, y) cloud pair per layer.

    ``forward(model, ids)`` runs the model on a batch of token ids (default: ``model(ids)``;
    Hugging Face models are called with ``use_cache=False``). ``progress(k)`` is told how many
    windows each batch processed.

    ``dist`` (under torchrun, every rank calling this with the same model and sample): each rank
    runs its share of the batches of windows (round robin) and rank 0 returns the clouds, their
    tokens in the order of one process; the other ranks return an empty list (the clouds of a
    large model are large: only the rank that writes them holds them all). A batch is the same
    windows on any rank, so the clouds are those of one process.

    ``bos`` (a tokenizer's BOS, ``TokenData.bos_id``): each window is read with it before its
    first token, as the model reads text; the sampled tokens are the same, one position later.
    """
    if site not in ("residual", "ffn"):
        raise ProbeError(f"unknown probe site {site!r} (residual or ffn)")
    device = next(model.parameters()).device
    run = forward or _default_forward
    windows = sample_windows(tokens, sample, seq_len, bos).to(device)
    sites = find_ffn_sites(model, width, lambda: run(model, windows[:1]))
    model.eval()
    window_index = torch.as_tensor(sample.window_index)
    positions = torch.as_tensor(sample.positions) + (0 if bos is None else 1)
    batches = []
    for start in range(0, len(windows), batch_size):
        stop = min(start + batch_size, len(windows))
        mask = (window_index >= start) & (window_index < stop)
        batches.append((start, stop, window_index[mask] - start, positions[mask]))

    def capture(mine: list[int]) -> list[Captured]:
        """Per batch of ``mine``: what each layer's hooks kept of its tokens, before and after."""
        captured: list[Captured] = []
        with torch.no_grad():
            for batch in mine:
                start, stop, rows, cols = batches[batch]
                if len(rows) == 0:
                    captured.append(([[] for _ in sites], [[] for _ in sites]))
                    continue
                index = (rows.to(device), cols.to(device))

                def select(t: torch.Tensor, index: tuple[torch.Tensor, ...] = index) -> Any:
                    return t[index]

                with _capture(sites, site, select) as (xs, ys):
                    run(model, windows[start:stop])
                captured.append((xs, ys))
                if progress is not None:
                    progress(stop - start)
        return captured

    captured = spread_over_ranks(len(batches), capture, dist, to_main=True)
    if dist is not None and not dist.is_main:
        return []
    return [
        (
            torch.cat([t for xs, _ in captured for t in xs[layer]]),
            torch.cat([t for _, ys in captured for t in ys[layer]]),
        )
        for layer in range(len(sites))
    ]


def _default_forward(model: nn.Module, ids: torch.Tensor) -> Any:
    if hasattr(model, "config") and hasattr(model.config, "use_cache"):
        return model(input_ids=ids, use_cache=False)
    return model(ids)
