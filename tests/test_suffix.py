"""Perturbations from the perturbed layer on (geospec.measure.suffix) against the reference: one
full forward pass per perturbation (geospec.measure.sensitivity)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hf_models
import pytest
import torch
import transformers as hf
from torch import nn

from geospec.engine.model import GPT, GPTConfig
from geospec.measure.probe import FFNSite, find_ffn_sites
from geospec.measure.sensitivity import (
    additivity,
    layer_sensitivity,
    logits_of,
    sample_pairs,
)
from geospec.measure.suffix import Perturbations, perturb_layers

pytestmark = pytest.mark.torch

VOCAB, SEQ = hf_models.VOCAB, 12
EPS = 0.5  # large: loss changes far above the 1e-6 tolerance, even in random tiny models


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    """Tiny tensors: thread hand-offs would cost far more than the arithmetic on 2 busy cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def batches(seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Three batches of unequal size (the last one short), as the diagnose stage's can be."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (7, SEQ + 1), generator=generator)
    return [(tokens[i : i + 3, :-1], tokens[i : i + 3, 1:]) for i in range(0, 7, 3)]


def geospec_model(style: str) -> GPT:
    torch.manual_seed(0)
    llama = style == "llama"
    config = GPTConfig(
        vocab_size=VOCAB,
        n_layers=4,
        d_model=32,
        n_heads=4,
        n_kv_heads=2 if llama else None,
        seq_len=SEQ,
        ffn_widths=[48, 80, 24, 64],
        activation="swiglu" if llama else "gelu",
        norm="rmsnorm" if llama else "layernorm",
        positions="rope" if llama else "learned",
        bias=not llama,
        tie_embeddings=not llama,
    )
    return GPT(config).eval()


def qwen2_sliding() -> nn.Module:
    """Qwen2 with sliding-window layers above the first two (Qwen2's layer types), window 4."""
    torch.manual_seed(0)
    config = hf.Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        use_sliding_window=True,
        sliding_window=4,
        max_window_layers=2,
    )
    return hf.Qwen2ForCausalLM(config).eval()


def gemma2_sliding() -> nn.Module:
    """Gemma 2 alternates sliding-window (here 4 tokens) and global layers."""
    model = hf_models.gemma2()
    model.config.sliding_window = 4
    return model


def pretrained_llama_bf16(directory: Path) -> nn.Module:
    """A checkpoint saved and read back in bfloat16, as a pretrained reference is."""
    hf_models.llama(intermediate_size=48).save_pretrained(directory)
    return hf.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.bfloat16).eval()


MODELS = {
    "geospec-gpt2": lambda tmp: (geospec_model("gpt2"), 32),
    "geospec-llama-gqa": lambda tmp: (geospec_model("llama"), 32),
    "hf-gpt2": lambda tmp: (hf_models.gpt2(), hf_models.WIDTH),
    "hf-llama-gqa": lambda tmp: (hf_models.llama(), hf_models.WIDTH),
    "hf-llama-pretrained-bf16": lambda tmp: (pretrained_llama_bf16(tmp), hf_models.WIDTH),
    "hf-gemma2-sliding": lambda tmp: (gemma2_sliding(), hf_models.WIDTH),
    "hf-qwen2-sliding": lambda tmp: (qwen2_sliding(), 32),
}


def sites_of(model: nn.Module, width: int) -> list[FFNSite]:
    return find_ffn_sites(model, width, lambda: logits_of(model, batches()[0][0][:1]))


def numbers(result: Any) -> list[float]:
    """Every number the diagnose stage stores: base, both sensitivities, the pairs' changes."""
    single, pairs = result
    return [
        single.base,
        *single.scale,
        *single.remove,
        *(value for p in pairs.pairs for value in (p.joint, p.singles, p.interaction)),
        pairs.r2,
    ]


def reference(model: nn.Module, sites: list[FFNSite], pairs: list[tuple[int, int]]) -> Any:
    single = layer_sensitivity(model, sites, batches(), EPS)
    return single, additivity(model, sites, batches(), single, pairs)


def fast(model: nn.Module, sites: list[FFNSite], pairs: list[tuple[int, int]]) -> Perturbations:
    return perturb_layers(model, sites, batches(), EPS, pairs)


@pytest.mark.parametrize("name", MODELS)
def test_from_the_layer_on_equals_full_forward_passes(name: str, tmp_path: Path) -> None:
    """GPT-2 and Llama styles (GQA, bfloat16 from a checkpoint), and models whose layers differ
    in attention masks (sliding windows): the suffix is used and every number equals the full
    forward passes' to 1e-6."""
    model, width = MODELS[name](tmp_path)
    sites = sites_of(model, width)
    pairs = sample_pairs(len(sites), 4, seed=1)
    expected = reference(model, sites, pairs)
    result = fast(model, sites, pairs)
    assert result.fallback is None
    got = numbers((result.sensitivity, result.additivity))
    assert got == pytest.approx(numbers(expected), abs=1e-6, rel=0)
    assert min(abs(v) for v in expected[0].remove) > 1e-5  # the tolerance is meaningful
    assert result.additivity.scale == expected[1].scale and len(got) == len(numbers(expected))


def test_each_perturbation_runs_only_the_layers_after_it() -> None:
    """Counted FFN calls: per batch one walk through the stack (L), for every layer l two runs
    of the L - 1 - l layers after it, for every pair (i, j) the L - 1 - j after j; plus the
    check on one window (a full pass, a walk, a full pass over other tokens, a run from the
    middle layer on). The full passes: (1 + 2 L + P) L per batch."""
    model, layers = geospec_model("llama"), 4
    sites = sites_of(model, 32)
    pairs = [(0, 1), (0, 3), (1, 2), (2, 3)]
    calls = [0]
    for site in sites:
        site.ffn.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    fast(model, sites, pairs)
    per_batch = layers + sum(2 * (layers - 1 - i) for i in range(layers))
    per_batch += sum(layers - 1 - j for _, j in pairs)
    check = 3 * layers + layers - 1 - (layers - 1) // 2
    assert calls[0] == check + len(batches()) * per_batch
    calls[0] = 0
    reference(model, sites, pairs)
    assert calls[0] == len(batches()) * (1 + 2 * layers + len(pairs)) * layers


def test_progress_counts_every_perturbation_of_every_batch() -> None:
    model = geospec_model("gpt2")
    sites = sites_of(model, 32)
    pairs = sample_pairs(4, 3, seed=0)
    steps: list[int] = []
    perturb_layers(model, sites, batches(), EPS, pairs, progress=steps.append)
    assert steps == [1] * len(batches()) * (2 * 4 + 3)


class ValueResidualLayer(nn.Module):
    """A pre-norm block whose attention also adds a value it reads from ``shared``: its own
    (``independent``), the first layer's (``shared``: value-residual transformers), or the layer
    before it's, handed over once per pass (``handoff``: the model empties ``shared`` first)."""

    def __init__(self, width: int, case: str, index: int, shared: dict[str, Any]) -> None:
        super().__init__()
        self.case, self.index, self.shared = case, index, shared
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.value = nn.Linear(width, width)
        self.ffn = nn.Sequential(
            nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        value = self.value(self.norm1(x))
        if self.case == "independent":
            other = value
        elif self.case == "shared":
            if self.index == 0:
                self.shared["value"] = value
            other = self.shared["value"]
        else:
            other = self.shared.pop("value") if self.index else value
            self.shared["value"] = value
        x = x + value + other
        return x + self.ffn(self.norm2(x))


class TinyLM(nn.Module):
    """Embedding, a stack of :class:`ValueResidualLayer`, a readout."""

    def __init__(self, case: str, width: int = 16, layers: int = 4) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.shared: dict[str, Any] = {}
        self.wte = nn.Embedding(VOCAB, width)
        self.blocks = nn.ModuleList(
            ValueResidualLayer(width, case, i, self.shared) for i in range(layers)
        )
        self.head = nn.Linear(width, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.blocks[0].case == "handoff":
            self.shared.clear()
        x = self.wte(ids)
        for block in self.blocks:
            x = block(x)
        out: torch.Tensor = self.head(x)
        return out


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("independent", None),
        ("shared", "the loss from layer 2 on depends on the tokens of the previous pass"),
        ("handoff", "running from layer 1 on fails: KeyError"),
    ],
)
def test_models_the_suffix_cannot_reproduce_use_full_forward_passes(
    case: str, reason: str | None
) -> None:
    """The check runs on the model itself: a first layer's value kept on the module for the
    later layers (state between passes), or a value handed from layer to layer within a pass,
    fall back and say why; the same blocks without shared state run from the layer on. The
    numbers equal the full passes' either way."""
    model = TinyLM(case).eval()
    sites = sites_of(model, 16)
    pairs = sample_pairs(4, 3, seed=0)
    result = fast(model, sites, pairs)
    if reason is None:
        assert result.fallback is None
    else:
        assert result.fallback is not None and reason in result.fallback
    expected = numbers(reference(model, sites, pairs))
    assert numbers((result.sensitivity, result.additivity)) == pytest.approx(expected, abs=1e-6)


def test_layers_and_training_mode_are_restored() -> None:
    """The replaced forwards and hooks are gone afterwards (an instance-level forward, as
    accelerate installs, is put back), and the model's training mode is as it was."""
    model = geospec_model("gpt2").train()
    sites = sites_of(model, 32)
    own = model.blocks[1].forward
    model.blocks[1].forward = own  # an instance attribute, as accelerate's hooks set
    before = logits_of(model.eval(), batches()[0][0])
    model.train()
    fast(model, sites, [(0, 1)])
    assert model.training
    assert model.blocks[1].__dict__["forward"] is own and "forward" not in model.blocks[2].__dict__
    assert all(not s.layer._forward_hooks and not s.pre_norm._forward_pre_hooks for s in sites)
    assert torch.equal(logits_of(model.eval(), batches()[0][0]), before)
