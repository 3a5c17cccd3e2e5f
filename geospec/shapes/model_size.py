"""Parameter counts computed from shapes alone (no torch, no model built).

The counts match :class:`geospec.engine.model.GPT` exactly (a test builds models of random shapes
and compares). FFN parameters are linear in the width with the same slope in every layer, so every
schedule whose widths sum to ``n_layers * ffn_width`` has exactly the uniform model's count.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import MISSING, dataclass, fields
from typing import Any


@dataclass(frozen=True)
class Shape:
    """The shape facts that determine the parameter count."""

    n_layers: int
    d_model: int
    n_heads: int
    vocab_size: int
    seq_len: int
    activation: str = "gelu"
    norm: str = "layernorm"
    positions: str = "learned"
    bias: bool = True
    tie_embeddings: bool = True
    n_kv_heads: int | None = None
    """Key/value heads of grouped-query attention (None: one per query head)."""
    ffn_out_bias: bool = False
    """Each FFN's output projection has a bias although ``bias`` is False (a pruned model's
    bias compensation, imported to heal it)."""
    qkv_bias: bool = False
    """The query, key and value projections have biases although ``bias`` is False (Qwen2's
    attention, imported to heal it)."""

    @property
    def kv_width(self) -> int:
        """Width of the key (and of the value) projection: kv heads x head size."""
        return kv_width(self.d_model, self.n_heads, self.n_kv_heads)

    @classmethod
    def of(cls, source: Any, **overrides: Any) -> Shape:
        """The shape of anything holding these fields as attributes or keys (the spec's
        ``[model]``, a ``GPTConfig``, a run's config.json); ``overrides`` replace fields."""
        values: dict[str, Any]
        if isinstance(source, Mapping):
            values = {f.name: source.get(f.name) for f in fields(cls) if f.name not in overrides}
        else:  # fields added later (n_kv_heads) keep their default where a source lacks them
            values = {
                f.name: getattr(source, f.name)
                if f.default is MISSING
                else getattr(source, f.name, f.default)
                for f in fields(cls)
                if f.name not in overrides
            }
        return cls(**values, **overrides)


def kv_width(d_model: int, n_heads: int, n_kv_heads: int | None) -> int:
    """Width of the key (and of the value) projection under grouped-query attention."""
    return d_model if n_kv_heads is None else d_model // n_heads * n_kv_heads


def kv_head_problems(model: Any) -> list[str]:
    """What is wrong with ``model.n_kv_heads`` (grouped-query attention): each key/value head
    serves a whole group of query heads, so it must divide ``n_heads``."""
    n_kv_heads = getattr(model, "n_kv_heads", None)
    if n_kv_heads is None or model.n_heads % n_kv_heads == 0:
        return []
    divisors = [d for d in range(1, model.n_heads + 1) if model.n_heads % d == 0]
    near = min(divisors, key=lambda d: (abs(d - n_kv_heads), d))
    return [
        f"{n_kv_heads} does not divide n_heads {model.n_heads}; choose a divisor such as {near}"
    ]


def attention_problems(model: Any) -> list[str]:
    """What is wrong with the attention shape of ``model`` (``d_model``, ``n_heads``,
    ``positions``): heads must divide the width, and rotary embeddings need an even head size."""
    if model.d_model % model.n_heads:
        divisors = [d for d in range(1, model.d_model + 1) if model.d_model % d == 0]
        near = min(divisors, key=lambda d: (abs(d - model.n_heads), d))
        return [
            f"{model.n_heads} does not divide d_model {model.d_model}; "
            f"choose a divisor such as {near}"
        ]
    if model.positions == "rope" and (model.d_model // model.n_heads) % 2:
        return ["rope needs an even head dimension (d_model / n_heads)"]
    return []


def ffn_params(d_model: int, width: int, activation: str, bias: bool) -> int:
    """Parameters of one FFN of hidden ``width``: gelu has 2 matrices, swiglu 3 (biases counted)."""
    matrices = 3 if activation == "swiglu" else 2
    hidden_biases = 2 if activation == "swiglu" else 1
    count = matrices * d_model * width
    if bias:
        count += hidden_biases * width + d_model
    return count


def norm_params(d_model: int, norm: str, bias: bool) -> int:
    return d_model + (d_model if norm == "layernorm" and bias else 0)


def attention_params(d_model: int, bias: bool, kv: int | None = None) -> int:
    """Query and output projections (d x d) plus key and value projections (d x ``kv``, the
    key/value width: ``d_model`` without grouped-query attention)."""
    kv = d_model if kv is None else kv
    return 2 * d_model * (d_model + kv) + (2 * (d_model + kv) if bias else 0)


def count_params(shape: Shape, widths: Sequence[int]) -> int:
    """Total trainable parameters of the model with these per-layer FFN widths."""
    if len(widths) != shape.n_layers:
        raise ValueError(f"{len(widths)} widths for {shape.n_layers} layers")
    d = shape.d_model
    total = shape.vocab_size * d
    if shape.positions == "learned":
        total += shape.seq_len * d
    if not shape.tie_embeddings:
        total += shape.vocab_size * d
    per_block_fixed = 2 * norm_params(d, shape.norm, shape.bias) + attention_params(
        d, shape.bias, shape.kv_width
    )
    total += shape.n_layers * per_block_fixed
    total += sum(ffn_params(d, w, shape.activation, shape.bias) for w in widths)
    if shape.ffn_out_bias and not shape.bias:
        total += shape.n_layers * d
    if shape.qkv_bias and not shape.bias:
        total += shape.n_layers * (d + 2 * shape.kv_width)
    total += norm_params(d, shape.norm, shape.bias)  # final norm
    return total


def total_ffn_params(d_model: int, widths: Sequence[int], activation: str, bias: bool) -> int:
    return sum(ffn_params(d_model, w, activation, bias) for w in widths)
