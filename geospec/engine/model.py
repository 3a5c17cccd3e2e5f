"""A GPT-style pre-norm decoder with one FFN width per layer.

Each block computes ``x = x + attn(norm1(x)); x = x + ffn(norm2(x))``. Submodule names are part
of the interface (probing hooks ``blocks[i].norm2`` and ``blocks[i].ffn``; checkpoints use names
such as ``blocks.3.ffn.fc.weight``). Layout, chosen to match :mod:`~geospec.shapes.model_size`
exactly:

- ``wte`` token embedding; ``wpe`` learned positions (GPT-2) or none with rotary embeddings (RoPE,
  rotate-half convention as in Llama/GPT-NeoX, applied to queries and keys);
- attention: one fused ``qkv`` projection and an output ``proj``;
- FFN: ``fc`` (d -> w for gelu; d -> 2w for swiglu, the gate half then the up half) and ``proj``
  (w -> d); gelu is GPT-2's tanh approximation;
- ``norm_f`` final norm; ``lm_head`` without bias, tied to ``wte`` when ``tie_embeddings``.

Initialisation follows GPT-2: N(0, 0.02) for linear and embedding weights, zero biases, and
N(0, 0.02 / sqrt(2 * n_layers)) for the two residual projections of each block.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from geospec.errors import SpecError, UsageError
from geospec.shapes.model_size import (
    Shape,
    attention_problems,
    count_params,
    kv_head_problems,
    kv_width,
)
from geospec.spec.sections import ModelSpec

LAYERNORM_EPS = 1e-5  # GPT-2's
RMSNORM_EPS = 1e-6  # Llama's
INIT_STD = 0.02


@dataclass(frozen=True)
class GPTConfig:
    """Everything that determines the model's shape and behaviour (saved as config.json)."""

    vocab_size: int
    n_layers: int
    d_model: int
    n_heads: int
    seq_len: int
    ffn_widths: list[int] = field(default_factory=list)
    activation: str = "gelu"
    norm: str = "layernorm"
    positions: str = "learned"
    rope_theta: float = 10000.0
    bias: bool = True
    tie_embeddings: bool = True
    dropout: float = 0.0
    n_kv_heads: int | None = None
    """Key/value heads of grouped-query attention (None: as many as n_heads)."""
    norm_eps: float | None = None
    """The norms' epsilon (None: GPT-2's 1e-5 for layernorm, 1e-6 for rmsnorm); set by a model
    imported from a pretrained checkpoint with its own (SmolLM2: 1e-5)."""
    ffn_out_bias: bool = False
    """Each FFN's output projection has a bias even where ``bias`` is False: a pruned model whose
    cut added FLAP's bias compensation (``prune.compensate``), imported to be healed."""
    qkv_bias: bool = False
    """The attention's query, key and value projections have biases even where ``bias`` is
    False (its output projection none): Qwen2's attention, imported to be healed."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "ffn_widths", [int(w) for w in self.ffn_widths])
        problems = []
        if len(self.ffn_widths) != self.n_layers:
            problems.append(f"{len(self.ffn_widths)} FFN widths for {self.n_layers} layers")
        if any(w < 1 for w in self.ffn_widths):
            problems.append(f"every FFN width must be >= 1, got {self.ffn_widths}")
        problems += [f"n_heads: {message}" for message in attention_problems(self)]
        problems += [f"n_kv_heads: {message}" for message in kv_head_problems(self)]
        if self.activation not in ("gelu", "swiglu"):
            problems.append(f"unknown activation {self.activation!r} (gelu or swiglu)")
        if self.norm not in ("layernorm", "rmsnorm"):
            problems.append(f"unknown norm {self.norm!r} (layernorm or rmsnorm)")
        if self.positions not in ("learned", "rope"):
            problems.append(f"unknown positions {self.positions!r} (learned or rope)")
        if problems:
            raise ValueError("invalid GPTConfig: " + "; ".join(problems))

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def shape(self) -> Shape:
        return Shape.of(self)

    def num_params(self) -> int:
        """Trainable parameters, computed without building the model."""
        return count_params(self.shape, self.ffn_widths)

    @property
    def kv_width(self) -> int:
        """Width of the key (and of the value) projection."""
        return kv_width(self.d_model, self.n_heads, self.n_kv_heads)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if data["n_kv_heads"] is None:  # added later: configs without GQA read as before
            del data["n_kv_heads"]
        if data["norm_eps"] is None:  # added later: configs of trained models read as before
            del data["norm_eps"]
        if not data["ffn_out_bias"]:  # added later, likewise
            del data["ffn_out_bias"]
        if not data["qkv_bias"]:  # added later, likewise
            del data["qkv_bias"]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GPTConfig:
        return cls(**data)


def config_from_spec(model: ModelSpec, widths: Sequence[int], vocab_size: int) -> GPTConfig:
    """The config of ``model`` with these FFN widths.

    ``vocab_size`` is the tokenizer's; ``model.vocab_size``, when set, overrides it (a padded
    vocabulary, for example 50304 for GPT-2's 50257) and must not be smaller.
    """
    vocab = vocab_size
    if model.vocab_size is not None:
        if model.vocab_size < vocab_size:
            raise SpecError(
                "spec",
                [
                    f"model.vocab_size: {model.vocab_size} is smaller than the tokenizer's "
                    f"vocabulary ({vocab_size}); remove model.vocab_size or raise it"
                ],
            )
        vocab = model.vocab_size
    if len(widths) != model.n_layers:
        raise UsageError(
            f"{len(widths)} FFN widths given for model.n_layers = {model.n_layers}; "
            "give one width per layer"
        )
    return GPTConfig(
        vocab_size=vocab,
        n_layers=model.n_layers,
        d_model=model.d_model,
        n_heads=model.n_heads,
        seq_len=model.seq_len,
        ffn_widths=list(widths),
        activation=model.activation,
        norm=model.norm,
        positions=model.positions,
        rope_theta=model.rope_theta,
        bias=model.bias,
        tie_embeddings=model.tie_embeddings,
        dropout=model.dropout,
        n_kv_heads=model.n_kv_heads,
    )


def make_norm(config: GPTConfig) -> nn.Module:
    if config.norm == "rmsnorm":
        return nn.RMSNorm(config.d_model, eps=config.norm_eps or RMSNORM_EPS)
    return nn.LayerNorm(config.d_model, eps=config.norm_eps or LAYERNORM_EPS, bias=config.bias)


def rope_tables(config: GPTConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of shape (seq_len, head_dim), frequencies repeated for the two halves."""
    half = config.head_dim // 2
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(half, dtype=torch.float64) / half))
    angles = torch.outer(torch.arange(config.seq_len, dtype=torch.float64), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (B, H, T, hd) queries or keys by position (rotate-half convention)."""
    first, second = x.chunk(2, dim=-1)
    rotated = torch.cat([-second, first], dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


class CausalSelfAttention(nn.Module):
    """Multi-head causal attention; with ``n_kv_heads`` < ``n_heads`` grouped-query attention
    (each key/value head serves ``n_heads / n_kv_heads`` consecutive query heads, as Llama's
    ``repeat_kv``). ``qkv`` holds the query, key and value projections in that order."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_heads = config.n_heads
        self.group = config.n_heads // (config.n_kv_heads or config.n_heads)
        self.dropout = config.dropout
        self.split = [config.d_model, config.kv_width, config.kv_width]
        self.qkv = nn.Linear(config.d_model, sum(self.split), bias=config.bias or config.qkv_bias)
        self.proj = nn.Linear(config.d_model, config.d_model, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> torch.Tensor:
        batch, time, channels = x.shape
        head_dim = channels // self.n_heads
        q, k, v = (
            part.view(batch, time, -1, head_dim).transpose(1, 2)
            for part in self.qkv(x).split(self.split, dim=2)
        )
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if self.group > 1:
            k, v = k.repeat_interleave(self.group, dim=1), v.repeat_interleave(self.group, dim=1)
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )
        y = y.transpose(1, 2).reshape(batch, time, channels)
        out: torch.Tensor = self.resid_dropout(self.proj(y))
        return out


class FeedForward(nn.Module):
    """One FFN of hidden ``width``: gelu(x W1) W2, or (silu(x Wg) * x Wu) W2 for swiglu."""

    def __init__(self, config: GPTConfig, width: int) -> None:
        super().__init__()
        self.width = width
        self.swiglu = config.activation == "swiglu"
        hidden_out = 2 * width if self.swiglu else width
        self.fc = nn.Linear(config.d_model, hidden_out, bias=config.bias)
        self.proj = nn.Linear(width, config.d_model, bias=config.bias or config.ffn_out_bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        if self.swiglu:
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        else:
            h = F.gelu(h, approximate="tanh")
        out: torch.Tensor = self.dropout(self.proj(h))
        return out


class Block(nn.Module):
    def __init__(self, config: GPTConfig, width: int) -> None:
        super().__init__()
        self.norm1 = make_norm(config)
        self.attn = CausalSelfAttention(config)
        self.norm2 = make_norm(config)
        self.ffn = FeedForward(config, width)

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), rope)
        return x + self.ffn(self.norm2(x))


class GPT(nn.Module):
    rope_cos: torch.Tensor
    rope_sin: torch.Tensor

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.d_model)
        self.wpe = (
            nn.Embedding(config.seq_len, config.d_model) if config.positions == "learned" else None
        )
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config, width) for width in config.ffn_widths)
        self.norm_f = make_norm(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.wte.weight
        if config.positions == "rope":
            cos, sin = rope_tables(config)
            # not persistent: derived from the config, so never stored in checkpoints
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """GPT-2 initialisation, residual projections scaled by 1 / sqrt(2 * n_layers)."""
        residual_std = INIT_STD / math.sqrt(2 * self.config.n_layers)
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                if module is self.lm_head and self.config.tie_embeddings:
                    continue
                std = residual_std if name.endswith((".attn.proj", ".ffn.proj")) else INIT_STD
                nn.init.normal_(module.weight, mean=0.0, std=std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=INIT_STD)
            elif isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
                module.reset_parameters()

    def num_params(self) -> int:
        """Trainable parameters of the built model (tied weights counted once)."""
        return sum(p.numel() for p in self.parameters())

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits (B, T, vocab) for token ids ``idx`` (B, T), and the mean cross-entropy loss
        against ``targets`` (B, T) when given."""
        time = idx.shape[1]
        if time > self.config.seq_len:
            raise ValueError(f"sequence of {time} tokens exceeds seq_len {self.config.seq_len}")
        x = self.wte(idx)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(time, device=idx.device))
        x = self.drop(x)
        rope = (self.rope_cos[:time], self.rope_sin[:time]) if self.wpe is None else None
        for block in self.blocks:
            x = block(x, rope)
        logits: torch.Tensor = self.lm_head(self.norm_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
        return logits, loss
