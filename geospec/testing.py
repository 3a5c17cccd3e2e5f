"""Helpers for testing geospec plugins, importable without pytest.

:func:`minimal_spec` builds a valid spec dictionary to modify; :func:`registered` makes a plugin
object's hook implementations visible to validation and the pipeline inside a ``with`` block;
:func:`check_importance` checks an importance plugin against its kind's contract.
The pytest fixtures built on them (``register_plugin``, ``geospec_registries``) live in
:mod:`geospec.pytest_plugin`, which pytest loads through the ``pytest11`` entry point.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any

from geospec.registry.entries import Provider
from geospec.registry.loading import Registries, build_registries, use_registries

_MINIMAL_SPEC: dict[str, Any] = {
    "name": "test",
    "model": {
        "n_layers": 4,
        "d_model": 32,
        "n_heads": 2,
        "ffn_width": 64,
        "seq_len": 32,
        "multiple_of": 8,
    },
    "data": {"tokenizer": {"kind": "bpe", "vocab_size": 512}},
    "measure": [],
    "arms": [{"name": "uniform", "schedule": {"kind": "uniform"}}],
    "train": {"steps": 10, "batch_size": 4},
}


def minimal_spec(**sections: Any) -> dict[str, Any]:
    """A valid spec dictionary; keyword arguments replace (or, for dicts, update) top-level keys."""
    spec = copy.deepcopy(_MINIMAL_SPEC)
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(spec.get(key), dict):
            spec[key].update(value)
        else:
            spec[key] = value
    return spec


@contextlib.contextmanager
def registered(
    *plugins: Any, name: str = "test-plugin", builtins: bool = True
) -> Iterator[Registries]:
    """Registries holding the builtins plus ``plugins`` (objects with hook implementations)."""
    extra = [(plugin, Provider(name, "0.0.0")) for plugin in plugins]
    with use_registries(build_registries(builtins=builtins, entry_points=False, extra=extra)) as r:
        yield r


class ContractError(AssertionError):
    """A plugin breaks its kind's contract; the message names the rule."""


def check_importance(
    cls: type[Any], params: dict[str, Any] | None = None, per_neuron: bool = True
) -> None:
    """Check an ``importance`` plugin class against its contract (docs/demand.md), on a random
    gated FFN of 24 neurons with calibration activations: one finite score per neuron, a float
    tensor without gradient, the same scores for the same FFN twice (an ordering is stored and
    reused), no change to the weights it was given, and (``per_neuron``; False for seeded noise
    such as ``random``) a neuron's score moving with it when the neurons are permuted. Raises
    :class:`ContractError` naming the broken rule. Imports torch."""
    import torch

    from geospec.kinds import Importance, NeuronWeights

    if not (isinstance(cls, type) and issubclass(cls, Importance)):
        raise ContractError(f"{cls!r} is not a geospec.kinds.Importance subclass")
    plugin = cls(cls.Params.model_validate(params or {}))
    generator = torch.Generator().manual_seed(0)
    gate, up = torch.randn(24, 8, generator=generator), torch.randn(24, 8, generator=generator)
    out = torch.randn(8, 24, generator=generator)
    activation = torch.rand(24, generator=generator) + 0.1
    ffn = NeuronWeights(3, (gate, up), out, activation if cls.needs_activations else None)
    before = [t.clone() for t in (gate, up, out, activation)]
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
    for tensor, original in zip((gate, up, out, activation), before, strict=True):
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
    )
    if not torch.allclose(plugin.scores(moved), scores[permutation], rtol=1e-5, atol=1e-6):
        raise ContractError(
            f"{name}: a neuron's score must move with it when the neurons are permuted (it "
            "may depend only on that neuron's weights and activation, or on the whole layer "
            "symmetrically)"
        )
