"""A pretrained Llama-family checkpoint imported into geospec's model (geospec.engine.imported):
the same logits as transformers' own forward, for SmolLM2's shape, untied embeddings and a pruned
model with uneven widths; and what geospec cannot reproduce is refused."""

from __future__ import annotations

import hf_models
import pytest
import torch
import transformers as hf

from geospec.engine.imported import import_llama, import_problem
from geospec.errors import UsageError
from geospec.measure.cut import cut_ffn

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_torch_thread")]


def smollm2_shaped(tie: bool = True, layers: int = 3) -> hf.LlamaForCausalLM:
    """SmolLM2-135M's attention and norms (9 query and 3 key/value heads of 64, rope theta
    100000, rmsnorm eps 1e-5), fewer layers, a smaller vocabulary, random weights."""
    torch.manual_seed(0)
    config = hf.LlamaConfig(
        vocab_size=257,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=layers,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        rope_theta=100000.0,
        tie_word_embeddings=tie,
    )
    model = hf.LlamaForCausalLM(config).eval()
    with torch.no_grad():  # norms away from 1, so a wrong epsilon or a swapped norm shows
        for parameter in model.parameters():
            if parameter.dim() == 1:
                parameter.uniform_(0.5, 1.5)
    return model


def logits_both(model: torch.nn.Module, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, vocab, (2, 40), generator=torch.Generator().manual_seed(1))
    imported = import_llama(model, seq_len=64)
    with torch.no_grad():
        expected = model(input_ids=ids).logits
        got, _ = imported(ids)
    return got, expected


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_smollm2_shaped_logits_equal_transformers(tie: bool) -> None:
    got, expected = logits_both(smollm2_shaped(tie), 257)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_a_pruned_model_imports_with_its_own_widths() -> None:
    model = smollm2_shaped(layers=3)
    for layer, keep in zip(model.model.layers, (768, 1536, 320), strict=True):
        cut_ffn(layer.mlp, list(range(0, 1536, 1536 // keep))[:keep])
    imported = import_llama(model, seq_len=64)
    assert imported.config.ffn_widths == [768, 1536, 320]
    got, expected = logits_both(model, 257)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_the_tiny_gqa_llama_imports() -> None:
    model = hf_models.llama()
    got, expected = logits_both(model, hf_models.VOCAB)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_what_geospec_cannot_compute_is_refused() -> None:
    assert "not Llama-family" in (import_problem(hf_models.gpt2()) or "")
    scaled = hf_models.llama()
    scaled.config.rope_parameters = {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}
    assert "scales its rotary" in (import_problem(scaled) or "")
    windowed = hf_models.mistral()
    windowed.config.sliding_window = 16
    assert "sliding window of 16" in (import_problem(windowed) or "")
    with pytest.raises(UsageError, match="cannot import this checkpoint"):
        import_llama(hf_models.gpt2(), seq_len=16)


def compensated(model: hf.LlamaForCausalLM) -> hf.LlamaForCausalLM:
    """``model`` with a random bias on every FFN output projection (what a compensated cut,
    prune.compensate = "mean", gives each layer)."""
    generator = torch.Generator().manual_seed(2)
    for layer in model.model.layers:
        down = layer.mlp.down_proj
        biased = torch.nn.Linear(down.in_features, down.out_features, bias=True)
        with torch.no_grad():
            biased.weight.copy_(down.weight)
            biased.bias.copy_(torch.randn(down.out_features, generator=generator))
        layer.mlp.down_proj = biased
    return model


def test_a_compensated_model_imports_with_its_output_biases() -> None:
    """Healing carries FLAP's compensation: the biases on the down projections are imported,
    and the logits are transformers' own, which they would not be without the biases."""
    model = smollm2_shaped(layers=2)
    cut_ffn(model.model.layers[0].mlp, list(range(0, 1536, 3)))
    model = compensated(model)
    assert import_problem(model) is None
    imported = import_llama(model, seq_len=64)
    assert imported.config.ffn_out_bias and imported.config.ffn_widths == [512, 1536]
    assert imported.config.num_params() == sum(p.numel() for p in imported.parameters())
    got, expected = logits_both(model, 257)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    stripped = smollm2_shaped(layers=2)  # the same weights without the biases differ
    cut_ffn(stripped.model.layers[0].mlp, list(range(0, 1536, 3)))
    _, unbiased = logits_both(stripped, 257)
    assert not torch.allclose(unbiased, expected, atol=1e-3)


def test_a_non_zero_gate_bias_or_some_output_biases_are_refused() -> None:
    model = compensated(smollm2_shaped(layers=2))
    model.model.layers[1].mlp.down_proj = torch.nn.Linear(1536, 576, bias=False)
    assert "some of its FFN output projections" in (import_problem(model) or "")
    gated = smollm2_shaped(layers=2)
    mlp = gated.model.layers[0].mlp
    mlp.gate_proj = torch.nn.Linear(576, 1536, bias=True)
    with torch.no_grad():
        mlp.gate_proj.bias.zero_()
    assert import_problem(gated) is None  # a compensated export's zero gate and up biases
    with torch.no_grad():
        mlp.gate_proj.bias.fill_(0.1)
    assert "gate_proj has a non-zero bias" in (import_problem(gated) or "")


@pytest.mark.parametrize("bias", [False, True], ids=["plain", "compensated"])
def test_a_trained_engine_model_loads_back_into_the_transformers_model(bias: bool) -> None:
    """load_into_llama is the way back: weights changed in geospec's engine (as healing changes
    them) copied into the transformers model give transformers' forward the engine's logits."""
    from geospec.engine.imported import load_into_llama

    model = smollm2_shaped(tie=False, layers=2)
    cut_ffn(model.model.layers[1].mlp, list(range(640)))
    if bias:
        model = compensated(model)
    gpt = import_llama(model, seq_len=64)
    with torch.no_grad():  # "healed": every weight moved
        for parameter in gpt.parameters():
            parameter.add_(0.01 * torch.randn_like(parameter))
    ids = torch.randint(0, 257, (2, 40), generator=torch.Generator().manual_seed(3))
    load_into_llama(model, gpt)
    with torch.no_grad():
        expected, _ = gpt(ids)
        got = model(input_ids=ids).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    other = smollm2_shaped(tie=False, layers=2)  # another width
    with pytest.raises(UsageError, match="FFN widths"):
        load_into_llama(other, gpt)
