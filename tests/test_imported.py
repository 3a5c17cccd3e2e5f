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
