"""Probing real transformers architectures built from configs (no download)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers as hf
from hf_models import LAYERS, VOCAB, WIDTH, gemma2, gpt2, llama

from geospec.measure.probe import ProbeError, find_ffn_sites, probe_clouds, sample_tokens

pytestmark = pytest.mark.torch

SEQ = 16


@pytest.fixture
def tokens() -> np.ndarray:
    return np.random.default_rng(0).integers(3, VOCAB, 4000).astype(np.uint16)


def windows_of(tokens: np.ndarray, sample) -> torch.Tensor:  # type: ignore[no-untyped-def]
    return torch.as_tensor(np.stack([tokens[w : w + SEQ].astype(np.int64) for w in sample.windows]))


@pytest.mark.parametrize("build", [llama, gpt2], ids=["llama", "gpt2"])
def test_residual_clouds_match_hidden_states_and_ffn_output(build, tokens) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    model = build()
    sample = sample_tokens(tokens, SEQ, 40, seed=1)
    clouds = probe_clouds(model, tokens, sample, SEQ, WIDTH, batch_size=3)
    ffn = probe_clouds(model, tokens, sample, SEQ, WIDTH, site="ffn", batch_size=3)
    ids = windows_of(tokens, sample)
    with torch.no_grad():
        hidden = model(input_ids=ids, output_hidden_states=True, use_cache=False).hidden_states
    rows, cols = torch.as_tensor(sample.window_index), torch.as_tensor(sample.positions)
    for layer, ((x, y), (_, ffn_out)) in enumerate(zip(clouds, ffn, strict=True)):
        assert x.shape == (40, WIDTH)
        # the FFN sub-layer's output is exactly what the residual stream gained
        torch.testing.assert_close(y - x, ffn_out, atol=1e-5, rtol=1e-5)
        if layer < LAYERS - 1:  # HF's last hidden state has the final norm applied
            torch.testing.assert_close(y, hidden[layer + 1][rows, cols], atol=1e-5, rtol=1e-5)


def test_gemma_sandwich_norm_counts_in_the_ffn_sublayer(tokens) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    model = gemma2()
    sites = find_ffn_sites(
        model, WIDTH, lambda: model(input_ids=torch.ones(1, 4, dtype=torch.long))
    )
    layer = model.model.layers[0]
    assert sites[0].ffn is layer.mlp
    assert sites[0].pre_norm is layer.pre_feedforward_layernorm
    sample = sample_tokens(tokens, SEQ, 20, seed=0)
    [(x, y), *_] = probe_clouds(model, tokens, sample, SEQ, WIDTH)
    with torch.no_grad():
        expected = layer.post_feedforward_layernorm(layer.mlp(layer.pre_feedforward_layernorm(x)))
    torch.testing.assert_close(y - x, expected, atol=1e-5, rtol=1e-4)


def test_batch_size_does_not_change_clouds(tokens) -> None:  # type: ignore[no-untyped-def]
    model = gpt2()
    sample = sample_tokens(tokens, SEQ, 30, seed=2)
    a = probe_clouds(model, tokens, sample, SEQ, WIDTH, batch_size=1)
    b = probe_clouds(model, tokens, sample, SEQ, WIDTH, batch_size=64)
    for (xa, ya), (xb, yb) in zip(a, b, strict=True):
        torch.testing.assert_close(xa, xb, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ya, yb, atol=1e-5, rtol=1e-5)


def test_sampling_is_deterministic_and_respects_skips(tokens) -> None:  # type: ignore[no-untyped-def]
    tokens = tokens.copy()
    tokens[::7] = 1  # a "special" token
    a = sample_tokens(tokens, SEQ, 100, seed=5, skip_first=4, skip_ids=[1])
    b = sample_tokens(tokens, SEQ, 100, seed=5, skip_first=4, skip_ids=[1])
    assert np.array_equal(a.positions, b.positions) and np.array_equal(a.windows, b.windows)
    assert (a.positions >= 4).all()
    chosen = tokens[a.windows[a.window_index] + a.positions]
    assert (chosen != 1).all()
    assert len({(w, p) for w, p in zip(a.window_index, a.positions, strict=True)}) == 100
    assert not np.array_equal(sample_tokens(tokens, SEQ, 100, seed=6).positions, a.positions)


def test_too_many_tokens_is_a_clear_error(tokens) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ProbeError, match=r"probe\.tokens"):
        sample_tokens(tokens[:64], SEQ, 100, seed=0)


def test_unmappable_model_is_a_clear_error() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    with pytest.raises(ProbeError, match="decoder layers"):
        find_ffn_sites(model, 4, lambda: model(torch.zeros(1, 4)))


def test_parallel_block_is_rejected() -> None:
    config = hf.GPTJConfig(
        vocab_size=VOCAB,
        n_embd=WIDTH,
        n_layer=2,
        n_head=4,
        rotary_dim=4,
        n_positions=64,
        bos_token_id=0,
        eos_token_id=1,
    )
    model = hf.GPTJForCausalLM(config).eval()
    with pytest.raises(ProbeError, match="parallel"):
        find_ffn_sites(model, WIDTH, lambda: model(input_ids=torch.ones(1, 4, dtype=torch.long)))
