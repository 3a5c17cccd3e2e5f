"""The importance kind's contract check (docs/plugins.md)."""

from __future__ import annotations

from typing import Any

from geospec.testing.contract import ContractError, plugin_instance


def check_importance(
    cls: type[Any], params: dict[str, Any] | None = None, per_neuron: bool = True
) -> None:
    """Check an ``importance`` plugin class against its contract (docs/plugins.md), on a random
    gated FFN of 24 neurons with calibration activations (``activation`` and consistent
    ``stats``: signed mean, mean |a| and mean square, for a score that ``needs_activations``;
    and ``second_moment``, E[a a^T], for one that ``needs_second_moments``):
    one finite score per neuron, a float tensor without gradient, the same scores for the same
    FFN twice (an ordering is stored and reused), no change to the weights or statistics it was
    given, and (``per_neuron``; False for seeded noise such as ``random``) a neuron's score
    moving with it when the neurons (and their statistics) are permuted. Raises
    :class:`ContractError` naming the broken rule. Imports torch."""
    import torch

    from geospec.kinds import ActivationStats, Importance, NeuronWeights

    plugin = plugin_instance(cls, Importance, params)
    generator = torch.Generator().manual_seed(0)
    gate, up = torch.randn(24, 8, generator=generator), torch.randn(24, 8, generator=generator)
    out = torch.randn(8, 24, generator=generator)
    # the statistics of real activations (heavy-tailed, shifted, of varied spread) on 64 tokens
    tokens = torch.randn(64, 24, generator=generator, dtype=torch.float64) ** 3
    tokens = tokens * (torch.rand(24, generator=generator, dtype=torch.float64) * 2 + 0.1)
    tokens = tokens + torch.randn(24, generator=generator, dtype=torch.float64)
    stats = ActivationStats(tokens.mean(0), tokens.abs().mean(0), tokens.square().mean(0))
    activation = stats.mean_abs.float()
    seconds = bool(getattr(cls, "needs_second_moments", False))
    needs = cls.needs_activations or seconds
    second = tokens.T @ tokens / len(tokens)
    ffn = NeuronWeights(
        3, (gate, up), out, activation if needs else None, stats if needs else None,
        second if seconds else None,
    )  # fmt: skip
    given = (gate, up, out, activation, stats.mean, stats.mean_abs, stats.mean_square, second)
    before = [t.clone() for t in given]
    name = cls.kind_name()
    scores = plugin.scores(ffn)
    if not isinstance(scores, torch.Tensor) or tuple(scores.shape) != (24,):
        shape = tuple(scores.shape) if isinstance(scores, torch.Tensor) else type(scores).__name__
        raise ContractError(
            f"{name}: scores must be a tensor of shape (width,) = (24,), got {shape}"
        )
    if not scores.dtype.is_floating_point:
        raise ContractError(f"{name}: scores must be floating point, got {scores.dtype}")
    if scores.requires_grad:
        raise ContractError(f"{name}: scores must carry no gradient")
    if not bool(torch.isfinite(scores).all()):
        raise ContractError(f"{name}: every score must be finite")
    for tensor, original in zip(given, before, strict=True):
        if not torch.equal(tensor, original):
            raise ContractError(f"{name}: scores must not change the weights they are given")
    if not torch.equal(plugin.scores(ffn), scores):
        raise ContractError(f"{name}: the same FFN must get the same scores (orderings are reused)")
    if not per_neuron:
        return
    permutation = torch.randperm(24, generator=generator)
    moved = NeuronWeights(
        3,
        (gate[permutation], up[permutation]),
        out[:, permutation],
        None if ffn.activation is None else activation[permutation],
        None if ffn.stats is None else stats.permuted(permutation),
        None if ffn.second_moment is None else second[permutation][:, permutation],
    )
    if not torch.allclose(plugin.scores(moved), scores[permutation], rtol=1e-5, atol=1e-6):
        raise ContractError(
            f"{name}: a neuron's score must move with it when the neurons are permuted (it "
            "may depend only on that neuron's weights and activation statistics, or on the whole "
            "layer symmetrically)"
        )
