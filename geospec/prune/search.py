"""The calibration text's verdict on pruned models, for the search allocations: the calibration
loss at widths near a base (``greedy``: each change of one layer's width recomputes only the
layers from it on), and the fitness of whole allocations (``evolve``: :class:`CalibrationFitness`;
a unit's search and its resumable state are :mod:`geospec.prune.unit_search`'s).

The base pruning is applied as zeroed activations (:func:`geospec.measure.cut.zeroed_neurons`:
what a cut computes exactly, without rebuilding modules); a change narrows one layer further by
zeroing more of its neurons on top. Per calibration batch the base model is walked one layer at a
time (:class:`geospec.measure.suffix.SuffixRunner`), and a change at layer l runs from layer l on,
from the base model's output of layer l - 1: the prefix is never computed again. A model whose
layers share state other than the residual stream fails
:func:`~geospec.measure.suffix.suffix_problem` and gets full forward passes instead (the same
numbers, slower).

A search's levels (a layer at a width) are the arm's importance order cut, or, with the arm's
repair set, repaired as the arm repairs (:class:`RepairedLevels`): mean compensation, or the
least-squares re-fit from the unpruned model's moments, one pass for every layer (as DarwinLM
builds its database of levels), each level's re-fit a solve on the kept neurons' block of those
moments, solved once and kept within :data:`~geospec.shapes.repair.LEVEL_CACHE_BYTES`.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from geospec.measure.cut import cut_modules, ffn_replaced, kept_neurons, zeroed_neurons
from geospec.measure.probe import FFNSite
from geospec.measure.sensitivity import Batch, logits_of, next_token_loss
from geospec.measure.suffix import SuffixRunner, suffix_problem
from geospec.prune.repair import Moments, Refit, layer_refit
from geospec.shapes.repair import LEVEL_CACHE_BYTES


def calibration_batches(
    tokens: np.ndarray,
    starts: np.ndarray,
    seq_len: int,
    batch_size: int,
    device: torch.device,
    bos: int | None = None,
) -> list[Batch]:
    """The calibration windows at ``starts`` as next-token batches: each window of ``seq_len``
    tokens predicts its last ``seq_len - 1`` from the ones before (with ``bos``, read after it,
    all ``seq_len``)."""
    from geospec.engine.batches import with_bos

    ids = torch.as_tensor(np.stack([tokens[s : s + seq_len].astype(np.int64) for s in starts]))
    inputs = with_bos(ids[:, :-1], bos) if bos is not None else ids[:, :-1]
    targets = ids if bos is not None else ids[:, 1:]
    return [
        (x.to(device), y.to(device))
        for x, y in zip(inputs.split(batch_size), targets.split(batch_size), strict=True)
    ]


class SuffixCutLosses:
    """:class:`geospec.kinds.CutLosses` of ``model`` on ``batches``, the neurons of layer l cut
    in the order ``orders[l]`` (best first)."""

    def __init__(
        self,
        model: nn.Module,
        sites: Sequence[FFNSite],
        orders: Sequence[Sequence[int]],
        batches: Sequence[Batch],
    ) -> None:
        self.model, self.sites, self.orders, self.batches = model, sites, orders, batches
        self.runner = SuffixRunner(model, sites, next_token_loss)
        with torch.no_grad():
            self.fallback = suffix_problem(self.runner, batches[0])
        """Why full forward passes are used (None: from the changed layer on)."""
        self.count = sum(targets.numel() for _, targets in batches)

    @contextmanager
    def _cut(self, layer: int, width: int) -> Iterator[None]:
        with zeroed_neurons(self.sites[layer].ffn, list(self.orders[layer][width:])):
            yield

    def __call__(self, widths: Sequence[int], changes: Sequence[tuple[int, int]]) -> list[float]:
        for layer, width in changes:
            if not 0 < width < widths[layer]:
                raise ValueError(f"layer {layer}: a change to {width} narrows no base {widths}")
        totals = [0.0] * len(changes)
        at: dict[int, list[int]] = {}  # layer -> indices of its changes
        for index, (layer, _) in enumerate(changes):
            at.setdefault(layer, []).append(index)
        last = max(at, default=-1)
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad(), ExitStack() as base:
                for layer, width in enumerate(widths):
                    base.enter_context(self._cut(layer, width))
                for batch in self.batches:
                    self._batch(batch, changes, at, last, totals)
        finally:
            self.model.train(was_training)
        return [total / self.count for total in totals]

    def _batch(
        self,
        batch: Batch,
        changes: Sequence[tuple[int, int]],
        at: dict[int, list[int]],
        last: int,
        totals: list[float],
    ) -> None:
        if self.fallback is not None:
            for index, (layer, width) in enumerate(changes):
                with self._cut(layer, width):
                    totals[index] += float(next_token_loss(self.model, *batch))
            return
        state = None  # the base model's output of the layer before
        for layer in range(last + 1):
            for index in at.get(layer, []):
                with self._cut(layer, changes[index][1]):
                    value, _ = self.runner.run(batch, layer - 1, state)
                assert value is not None
                totals[index] += value
            if layer < last:
                _, walked = self.runner.run(batch, layer - 1, state, keep=(layer,), stop=layer)
                state = walked[layer][1]


def next_token_kl(model: nn.Module, inputs: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """Summed KL divergence KL(teacher || model) of the next-token distributions at every
    position, ``teacher`` the unpruned model's log-probabilities there: per token in float32,
    summed in float64 (as :func:`~geospec.measure.sensitivity.next_token_loss`)."""
    student = logits_of(model, inputs).float().log_softmax(-1)
    per_token = F.kl_div(student, teacher, reduction="none", log_target=True).sum(-1)
    return per_token.double().sum()


#: Token ids travel as float32 beside the log-probabilities in a lumped teacher: exact below this.
_EXACT_IDS = 2**24


def lumped_teacher(log_probs: torch.Tensor, top_k: int) -> torch.Tensor:
    """The unpruned model's next-token log-probabilities ``log_probs`` (positions x vocabulary)
    as its ``top_k`` most likely tokens with the rest lumped into one bucket, packed in one
    float32 tensor, positions x (2 top_k + 1): the top tokens' log-probabilities, their ids,
    and the log of the rest's mass (-inf where nothing is left)."""
    vocabulary = log_probs.shape[-1]
    if vocabulary >= _EXACT_IDS:
        raise ValueError(f"a vocabulary of {vocabulary} tokens: ids from 2^24 on are not exact")
    top, ids = log_probs.topk(min(top_k, vocabulary), dim=-1)
    rest = log_probs.scatter(-1, ids, float("-inf")).logsumexp(-1, keepdim=True)
    return torch.cat([top, ids.float(), rest], -1)


def lumped_kl(model: nn.Module, inputs: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """Summed KL divergence KL(teacher || model) of the next-token distributions coarsened to
    the teacher's top k tokens and one bucket of every other token, at every position
    (``teacher`` from :func:`lumped_teacher`): sum over the top k of p log(p / q), plus
    P log(P / Q) of the rest's masses P and Q (Q = 1 minus the model's top-k mass; nothing where
    P is 0). The full KL when k is the vocabulary; below it, never above the full KL (coarsening
    loses information) and cheaper: the model's log-probabilities are read only at k tokens,
    after one log-sum-exp over the vocabulary. In float32 (float64 logits in float64), summed
    in float64."""
    k = (teacher.shape[-1] - 1) // 2
    log_p, ids, log_p_rest = teacher[..., :k], teacher[..., k : 2 * k].long(), teacher[..., -1]
    logits = logits_of(model, inputs)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # float32 at least
    log_q = (logits.gather(-1, ids) - logits.logsumexp(-1, keepdim=True)).double()
    log_p, log_p_rest = log_p.double(), log_p_rest.double()
    top = (log_p.exp() * (log_p - log_q)).sum(-1)
    # the model's rest from its top-k mass; at float32's resolution of 1 at least (a rest the
    # rounding of that mass cannot resolve)
    q_rest = (1 - log_q.exp().sum(-1)).clamp_min(torch.finfo(torch.float32).eps)
    p_rest = log_p_rest.exp()
    rest = torch.where(p_rest > 0, p_rest * (log_p_rest - q_rest.log()), 0.0)
    return (top + rest).sum()


class RepairedLevels:
    """Each level (a layer at a width) a search visits, cut to the ``width`` best neurons of
    ``orders[layer]`` and repaired as the arm repairs, from the unpruned model's calibration
    text: with ``means`` (each layer's signed mean activations) mean compensation; with
    ``moments`` (each layer's :class:`~geospec.prune.repair.Moments` from one pass of the
    unpruned model) the least-squares re-fit with ``damping`` and ``intercept``
    (:func:`~geospec.prune.repair.layer_refit`: the same numbers as
    :func:`~geospec.prune.repair.one_pass_refits` gives that layer in any allocation).

    A re-fit is solved the first time its level is asked for and kept, in the output
    projection's dtype, while the kept ones take at most ``bound`` bytes: beyond it the least
    recently used are dropped (asked again, solved again: the same numbers, so the bound costs
    time, never a different fitness). The counts say what the search cost."""

    def __init__(
        self,
        sites: Sequence[FFNSite],
        orders: Sequence[Sequence[int]],
        *,
        means: Sequence[torch.Tensor] | None = None,
        moments: Sequence[Moments] | None = None,
        damping: float = 0.0,
        intercept: bool = True,
        bound: int = LEVEL_CACHE_BYTES,
    ) -> None:
        if (means is None) == (moments is None):
            raise ValueError("repaired levels are mean-compensated or re-fitted: one of the two")
        self.sites, self.orders, self.means, self.moments = sites, orders, means, moments
        self.damping, self.intercept, self.bound = damping, intercept, bound
        self._kept: OrderedDict[tuple[int, int], Refit] = OrderedDict()
        self.held = 0
        """The bytes the kept re-fits take now."""
        self.peak = 0
        """The most bytes they took at once."""
        self.solved = 0
        """Re-fits solved (a level dropped and asked again counts again)."""
        self.reused = 0
        """Levels asked for whose re-fit was kept."""
        self.seconds = 0.0
        """The time spent solving."""

    def describe(self) -> str:
        """What the levels are, for the prune's progress line."""
        if self.moments is None:
            return "mean-compensated levels"
        return (
            f"least-squares levels from the unpruned model's inputs (damping {self.damping:g}"
            f"{'' if self.intercept else ', no intercept'}; at most {_mib(self.bound)} kept)"
        )

    def modules(self, layer: int, width: int) -> dict[str, nn.Module]:
        """Layer ``layer``'s projections at ``width`` neurons, repaired
        (:func:`~geospec.measure.cut.cut_modules`)."""
        ffn = self.sites[layer].ffn
        keep = kept_neurons(self.orders[layer], width)
        if self.means is not None:
            return cut_modules(ffn, keep, compensate=self.means[layer])
        return cut_modules(ffn, keep, refit=self.refit(layer, width))

    def refit(self, layer: int, width: int) -> Refit:
        """Layer ``layer``'s re-fit at ``width`` neurons: kept, or solved now."""
        assert self.moments is not None
        key = (layer, width)
        if key in self._kept:
            self.reused += 1
            self._kept.move_to_end(key)
            return self._kept[key]
        keep = kept_neurons(self.orders[layer], width)
        started = time.perf_counter()
        found = layer_refit(
            self.sites[layer].ffn, self.moments[layer], keep, self.damping, self.intercept
        )
        self.seconds += time.perf_counter() - started
        self.solved += 1
        self._kept[key] = found
        self.held += _bytes(found)
        while self.held > self.bound:  # this one too, if it alone is more than the bound
            _, dropped = self._kept.popitem(last=False)
            self.held -= _bytes(dropped)
        self.peak = max(self.peak, self.held)
        return found


def _bytes(refit: Refit) -> int:
    return sum(t.numel() * t.element_size() for t in refit if t is not None)


def _mib(count: int) -> str:
    return f"{count / 2**20:,.0f} MiB"


class CalibrationFitness:
    """:class:`geospec.kinds.Fitness` of ``model`` on the calibration windows of ``batches``
    (the prune's calibration sample: training text), the neurons of layer l kept in the order
    ``orders[l]`` (best first): ``kind`` "kl" (from the unpruned model's next-token
    distribution) or "loss" (the next-token loss).

    The unpruned model's log-probabilities of a window are computed the first time it is drawn
    and kept in ``teacher`` (shared by every search on the same windows: windows x positions x
    vocabulary floats at most). A candidate is cut by zeroed activations, as
    :class:`SuffixCutLosses` cuts, and runs from its first layer that differs from the base
    (the parent), from the base's output of the layer before: one pass of the base per batch
    keeps those outputs.

    ``cut`` says how a candidate is cut: "true" (the default) runs each layer at its width, its
    projections sliced to the kept neurons (each layer's slices at a width built once per call
    and shared by every candidate and batch of it); "zero" runs every layer at full width with
    the removed neurons' activations zeroed. The same numbers up to float rounding (tested);
    which is faster is ``benchmarks/search.py``'s to say (true widths, on SmolLM2).

    ``top_k`` (the KL only): the KL over the unpruned model's ``top_k`` most likely tokens at
    each position with the rest lumped into one bucket (:func:`lumped_kl`), the teacher kept
    as those tokens alone (positions x (2 top_k + 1) floats a window, under its own keys in
    ``teacher``).

    ``levels``: each layer at each width repaired as they say (:class:`RepairedLevels`; true
    widths only), in place of the plain cut."""

    def __init__(
        self,
        model: nn.Module,
        sites: Sequence[FFNSite],
        orders: Sequence[Sequence[int]],
        batches: Sequence[Batch],
        kind: str,
        batch_size: int,
        teacher: dict[Any, torch.Tensor] | None = None,
        cut: str = "true",
        top_k: int | None = None,
        levels: RepairedLevels | None = None,
    ) -> None:
        if kind not in ("kl", "loss"):
            raise ValueError(f"fitness is 'kl' or 'loss', not {kind!r}")
        if cut not in ("true", "zero"):
            raise ValueError(f"cut is 'true' or 'zero', not {cut!r}")
        if levels is not None and cut != "true":
            raise ValueError("repaired levels are cut to their true widths, not zeroed")
        self.cut, self.levels = cut, levels
        self._narrowed: dict[tuple[int, int], dict[str, nn.Module]] = {}  # during a call
        self.model, self.sites, self.orders, self.kind = model, sites, orders, kind
        self.inputs = torch.cat([inputs for inputs, _ in batches])
        self.targets = torch.cat([targets for _, targets in batches])
        self.windows = int(self.inputs.shape[0])
        self.window_tokens = int(self.targets.shape[1])
        self.batch_size = batch_size
        if top_k is not None and (kind != "kl" or top_k < 1):
            raise ValueError(f"top_k {top_k} lumps a KL fitness's tail: a positive count, 'kl'")
        self.top_k = top_k
        self.teacher = {} if teacher is None else teacher
        kl = next_token_kl if top_k is None else lumped_kl
        self.runner = SuffixRunner(model, sites, next_token_loss if kind == "loss" else kl)
        self.fallback: str | None = None
        """Why full forward passes are used (None: from the first changed layer on)."""
        self._checked = False

    def prepare(self, windows: Sequence[int]) -> None:
        """Compute the unpruned model's log-probabilities of ``windows`` now, as the search's
        first draw of them would (a benchmark times the generations without them)."""
        if self.kind == "kl":
            with torch.no_grad():
                for row in windows:
                    self._teacher(row)

    def _teacher(self, row: int) -> torch.Tensor:
        # one window a pass, whichever windows are drawn with it: a window's numbers never
        # depend on its company, so a resumed search sees the same teacher bit for bit
        key = row if self.top_k is None else (self.top_k, row)  # lumped: kept apart
        if key not in self.teacher:
            logits = logits_of(self.model, self.inputs[row : row + 1])
            log_probs = logits.float().log_softmax(-1)[0]
            k = self.top_k
            self.teacher[key] = log_probs if k is None else lumped_teacher(log_probs, k)
        return self.teacher[key]

    def _batch(self, rows: Sequence[int]) -> Batch:
        """Rows ``rows`` as the runner's batch: the inputs with the targets or, for the KL, the
        unpruned model's log-probabilities (computed here, before any cut is in place)."""
        inputs = self.inputs[list(rows)]
        if self.kind == "loss":
            return inputs, self.targets[list(rows)]
        return inputs, torch.stack([self._teacher(row) for row in rows])

    @contextmanager
    def _cut(self, widths: Sequence[int]) -> Iterator[None]:
        with ExitStack() as stack:
            for layer, width in enumerate(widths):
                if width >= len(self.orders[layer]):
                    continue
                ffn = self.sites[layer].ffn
                if self.cut == "zero":
                    stack.enter_context(zeroed_neurons(ffn, list(self.orders[layer][width:])))
                    continue
                if (layer, width) not in self._narrowed:
                    self._narrowed[(layer, width)] = (
                        cut_modules(ffn, list(self.orders[layer][:width]))
                        if self.levels is None
                        else self.levels.modules(layer, width)
                    )
                stack.enter_context(ffn_replaced(ffn, self._narrowed[(layer, width)], width))
            yield

    def __call__(
        self,
        candidates: Sequence[Sequence[int]],
        windows: Sequence[int],
        base: Sequence[int] | None = None,
    ) -> list[float]:
        for widths in candidates:
            if len(widths) != len(self.sites):
                raise ValueError(f"{len(widths)} widths for {len(self.sites)} layers")
        rows = sorted(windows)
        firsts = [_first_change(widths, base) for widths in candidates]
        totals = [0.0] * len(candidates)
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                for i in range(0, len(rows), self.batch_size):
                    batch = self._batch(rows[i : i + self.batch_size])
                    if not self._checked:  # the premise, on the model itself, once
                        self.fallback = suffix_problem(self.runner, batch)
                        self._checked = True
                    self._add(batch, candidates, base, firsts, totals)
        finally:
            self.model.train(was_training)
            self._narrowed.clear()  # a call's slices: the next generation cuts other widths
        count = len(rows) * self.window_tokens
        return [total / count for total in totals]

    def _add(
        self,
        batch: Batch,
        candidates: Sequence[Sequence[int]],
        base: Sequence[int] | None,
        firsts: Sequence[int | None],
        totals: list[float],
    ) -> None:
        """Add each candidate's summed fitness on ``batch`` to ``totals``."""
        if self.fallback is not None or base is None:
            for index, widths in enumerate(candidates):
                with self._cut(widths):
                    totals[index] += float(self.runner.loss(self.model, *batch))
            return
        needed = sorted({first - 1 for first in firsts if first is not None and first > 0})
        with self._cut(base):
            own, states = self.runner.run(batch, -1, None, keep=needed)
        assert own is not None
        for index, (widths, first) in enumerate(zip(candidates, firsts, strict=True)):
            if first is None:  # the base itself
                totals[index] += own
                continue
            state = states[first - 1][1] if first > 0 else None
            with self._cut(widths):
                value, _ = self.runner.run(batch, first - 1, state)
            assert value is not None
            totals[index] += value


def _first_change(widths: Sequence[int], base: Sequence[int] | None) -> int | None:
    """The first layer where ``widths`` differs from ``base`` (0 without a base; None: none)."""
    if base is None:
        return 0
    for layer, (w, b) in enumerate(zip(widths, base, strict=True)):
        if w != b:
            return layer
    return None
