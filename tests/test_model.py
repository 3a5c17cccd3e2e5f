"""The model: parameter counts, equivalence with reference implementations, causality, init."""

from __future__ import annotations

import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from geospec.engine.model import GPT, GPTConfig, config_from_spec
from geospec.errors import SpecError, UsageError
from geospec.kinds import ModelDims
from geospec.registry.loading import get_registries
from geospec.shapes.model_size import Shape, count_params
from geospec.spec.sections import ModelSpec

pytestmark = pytest.mark.torch


@st.composite
def configs(draw: st.DrawFn) -> GPTConfig:
    n_layers = draw(st.integers(1, 4))
    n_heads = draw(st.integers(1, 4))
    head_dim = 2 * draw(st.integers(1, 6))
    divisors = [k for k in range(1, n_heads + 1) if n_heads % k == 0]
    return GPTConfig(
        n_kv_heads=draw(st.sampled_from([None, *divisors])),
        vocab_size=draw(st.integers(2, 300)),
        n_layers=n_layers,
        d_model=n_heads * head_dim,
        n_heads=n_heads,
        seq_len=draw(st.integers(1, 64)),
        ffn_widths=draw(st.lists(st.integers(1, 80), min_size=n_layers, max_size=n_layers)),
        activation=draw(st.sampled_from(["gelu", "swiglu"])),
        norm=draw(st.sampled_from(["layernorm", "rmsnorm"])),
        positions=draw(st.sampled_from(["learned", "rope"])),
        bias=draw(st.booleans()),
        tie_embeddings=draw(st.booleans()),
    )


@settings(max_examples=40, deadline=None)
@given(configs())
def test_parameter_count_matches_the_built_model(config: GPTConfig) -> None:
    model = GPT(config)
    built = sum(p.numel() for p in model.parameters())  # parameters() yields tied weights once
    assert config.num_params() == built == model.num_params()


def test_every_arm_of_a_budget_has_the_same_count() -> None:
    spec = ModelSpec(n_layers=8, d_model=64, n_heads=4, ffn_width=256, seq_len=32, multiple_of=16)
    dims = ModelDims(spec.n_layers, spec.d_model, spec.ffn_width, spec.multiple_of)
    registries = get_registries()
    schedule_cls = registries["schedule"].get("cosine").cls
    arms = [
        [256] * 8,
        schedule_cls(schedule_cls.Params(start=1.8, end=0.2)).widths(dims, {}),
    ]
    rng = random.Random(0)
    for _ in range(5):  # random compositions of the budget into 8 positive widths
        cuts = sorted(rng.sample(range(1, 8 * 256), 7))
        arms.append([b - a for a, b in zip([0, *cuts], [*cuts, 8 * 256], strict=True)])
    counts = set()
    for widths in arms:
        assert sum(widths) == 8 * 256
        config = config_from_spec(spec, widths, vocab_size=100)
        counts.add(GPT(config).num_params())
        counts.add(count_params(config.shape, widths))
    assert len(counts) == 1


def _copy_into_gpt2(model: GPT, hf: torch.nn.Module) -> None:
    """Load geospec weights into transformers' GPT2LMHeadModel (its Conv1D stores W transposed)."""
    sd = model.state_dict()
    out = {"transformer.wte.weight": sd["wte.weight"], "transformer.wpe.weight": sd["wpe.weight"]}
    names = {
        "norm1": "ln_1",
        "norm2": "ln_2",
        "attn.qkv": "attn.c_attn",
        "attn.proj": "attn.c_proj",
        "ffn.fc": "mlp.c_fc",
        "ffn.proj": "mlp.c_proj",
    }
    for key, value in sd.items():
        if not key.startswith("blocks."):
            continue
        _, layer, rest = key.split(".", 2)
        module, kind = rest.rsplit(".", 1)
        transposed = kind == "weight" and not module.startswith("norm")
        out[f"transformer.h.{layer}.{names[module]}.{kind}"] = value.T if transposed else value
    out["transformer.ln_f.weight"] = sd["norm_f.weight"]
    out["transformer.ln_f.bias"] = sd["norm_f.bias"]
    out["lm_head.weight"] = sd["wte.weight"]
    missing, unexpected = hf.load_state_dict(out, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}


def test_gpt2_layout_matches_transformers_gpt2() -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPTConfig(
        vocab_size=97, n_layers=3, d_model=48, n_heads=4, seq_len=20, ffn_widths=[80] * 3
    )
    model = GPT(config).eval()
    hf_config = GPT2Config(
        vocab_size=97,
        n_positions=20,
        n_embd=48,
        n_layer=3,
        n_head=4,
        n_inner=80,
        activation_function="gelu_new",
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        layer_norm_epsilon=1e-5,
        bos_token_id=0,
        eos_token_id=0,
    )
    hf = GPT2LMHeadModel(hf_config).eval()
    _copy_into_gpt2(model, hf)
    assert model.num_params() == sum(p.numel() for p in hf.parameters())
    idx = torch.randint(0, 97, (2, 20))
    with torch.no_grad():
        logits, loss = model(idx, idx)
        reference = hf(idx, labels=idx)
    torch.testing.assert_close(logits, reference.logits, atol=1e-5, rtol=1e-5)
    # transformers shifts labels internally; ours are already shifted targets: compare by hand
    expected = torch.nn.functional.cross_entropy(reference.logits.flatten(0, 1), idx.flatten())
    assert loss is not None and abs(loss.item() - expected.item()) < 1e-5


def test_llama_layout_matches_transformers_llama() -> None:
    """rmsnorm + swiglu + rope + no bias + untied embeddings is a Llama decoder."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(1)
    d, width, heads = 32, 56, 4
    config = GPTConfig(
        vocab_size=61,
        n_layers=2,
        d_model=d,
        n_heads=heads,
        seq_len=24,
        ffn_widths=[width] * 2,
        activation="swiglu",
        norm="rmsnorm",
        positions="rope",
        rope_theta=500.0,
        bias=False,
        tie_embeddings=False,
    )
    model = GPT(config).eval()
    hf_config = LlamaConfig(
        vocab_size=61,
        hidden_size=d,
        intermediate_size=width,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=24,
        rms_norm_eps=1e-6,
        rope_theta=500.0,
        tie_word_embeddings=False,
        attention_bias=False,
        mlp_bias=False,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=None,
    )
    hf = LlamaForCausalLM(hf_config).eval()
    sd = model.state_dict()
    out = {
        "model.embed_tokens.weight": sd["wte.weight"],
        "model.norm.weight": sd["norm_f.weight"],
        "lm_head.weight": sd["lm_head.weight"],
    }
    for layer in range(2):
        p, q = f"blocks.{layer}.", f"model.layers.{layer}."
        wq, wk, wv = sd[p + "attn.qkv.weight"].split(d)
        gate, up = sd[p + "ffn.fc.weight"].split(width)
        out |= {
            q + "input_layernorm.weight": sd[p + "norm1.weight"],
            q + "post_attention_layernorm.weight": sd[p + "norm2.weight"],
            q + "self_attn.q_proj.weight": wq,
            q + "self_attn.k_proj.weight": wk,
            q + "self_attn.v_proj.weight": wv,
            q + "self_attn.o_proj.weight": sd[p + "attn.proj.weight"],
            q + "mlp.gate_proj.weight": gate,
            q + "mlp.up_proj.weight": up,
            q + "mlp.down_proj.weight": sd[p + "ffn.proj.weight"],
        }
    hf.load_state_dict(out, strict=True)
    assert model.num_params() == sum(p.numel() for p in hf.parameters())
    idx = torch.randint(0, 61, (3, 24))
    with torch.no_grad():
        logits, _ = model(idx)
        reference = hf(idx).logits
    torch.testing.assert_close(logits, reference, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("positions", ["learned", "rope"])
def test_attention_is_causal(positions: str) -> None:
    torch.manual_seed(2)
    config = GPTConfig(
        vocab_size=50,
        n_layers=2,
        d_model=32,
        n_heads=2,
        seq_len=16,
        ffn_widths=[40, 24],
        positions=positions,
    )
    model = GPT(config).eval()
    idx = torch.randint(0, 50, (1, 16))
    changed = idx.clone()
    changed[0, 9] = (idx[0, 9] + 1) % 50
    with torch.no_grad():
        a, _ = model(idx)
        b, _ = model(changed)
    torch.testing.assert_close(a[:, :9], b[:, :9])
    assert not torch.allclose(a[:, 9:], b[:, 9:])


def test_gpt2_initialisation() -> None:
    torch.manual_seed(3)
    n_layers = 4
    config = GPTConfig(
        vocab_size=2000,
        n_layers=n_layers,
        d_model=256,
        n_heads=4,
        seq_len=64,
        ffn_widths=[1024] * n_layers,
    )
    model = GPT(config)
    residual = 0.02 / math.sqrt(2 * n_layers)
    for name, param in model.named_parameters():
        if name.endswith("bias"):
            assert torch.count_nonzero(param) == 0, name
        elif "norm" in name:
            assert torch.all(param == 1), name
        else:
            expected = residual if name.endswith(("attn.proj.weight", "ffn.proj.weight")) else 0.02
            assert param.std().item() == pytest.approx(expected, rel=0.05), name
            assert abs(param.mean().item()) < 0.1 * expected, name


def test_tied_embeddings_share_storage() -> None:
    tied = GPT(
        GPTConfig(vocab_size=30, n_layers=1, d_model=8, n_heads=2, seq_len=4, ffn_widths=[8])
    )
    untied = GPT(
        GPTConfig(
            vocab_size=30,
            n_layers=1,
            d_model=8,
            n_heads=2,
            seq_len=4,
            ffn_widths=[8],
            tie_embeddings=False,
        )
    )
    assert tied.lm_head.weight is tied.wte.weight
    assert untied.lm_head.weight.data_ptr() != untied.wte.weight.data_ptr()


def test_block_structure_for_probing() -> None:
    """The prober hooks norm2's input and ffn's output: their sum is the block's output."""
    torch.manual_seed(4)
    config = GPTConfig(
        vocab_size=40,
        n_layers=3,
        d_model=16,
        n_heads=2,
        seq_len=8,
        ffn_widths=[16, 32, 48],
        positions="rope",
    )
    model = GPT(config).eval()
    captured: dict[str, torch.Tensor] = {}
    block = model.blocks[1]
    block.norm2.register_forward_hook(lambda m, args, out: captured.update(x=args[0]))
    block.ffn.register_forward_hook(lambda m, args, out: captured.update(f=out))
    block.register_forward_hook(lambda m, args, out: captured.update(y=out))
    with torch.no_grad():
        model(torch.randint(0, 40, (2, 8)))
    torch.testing.assert_close(captured["y"], captured["x"] + captured["f"])
    names = dict(model.named_parameters())
    assert names["blocks.2.ffn.fc.weight"].shape == (48, 16)
    assert names["blocks.2.ffn.proj.weight"].shape == (16, 48)
    assert [b.ffn.width for b in model.blocks] == [16, 32, 48]


def test_config_checks_and_round_trip() -> None:
    with pytest.raises(ValueError, match="2 FFN widths for 3 layers"):
        GPTConfig(vocab_size=10, n_layers=3, d_model=8, n_heads=2, seq_len=4, ffn_widths=[8, 8])
    with pytest.raises(ValueError, match="does not divide"):
        GPTConfig(vocab_size=10, n_layers=1, d_model=10, n_heads=3, seq_len=4, ffn_widths=[8])
    config = GPTConfig(
        vocab_size=10,
        n_layers=2,
        d_model=8,
        n_heads=2,
        seq_len=4,
        ffn_widths=[4, 12],
        activation="swiglu",
    )
    assert GPTConfig.from_dict(config.to_dict()) == config


def test_config_from_spec_vocabulary() -> None:
    spec = ModelSpec(n_layers=2, d_model=16, n_heads=2, ffn_width=32, seq_len=8, multiple_of=8)
    assert config_from_spec(spec, [24, 40], vocab_size=257).vocab_size == 257
    padded = spec.model_copy(update={"vocab_size": 320})
    assert config_from_spec(padded, [32, 32], vocab_size=257).vocab_size == 320
    with pytest.raises(SpecError, match="smaller than the tokenizer"):
        config_from_spec(spec.model_copy(update={"vocab_size": 100}), [32, 32], vocab_size=257)
    with pytest.raises(UsageError, match="3 FFN widths"):
        config_from_spec(spec, [32, 16, 16], vocab_size=257)


def test_sequence_longer_than_context_is_refused() -> None:
    model = GPT(
        GPTConfig(vocab_size=10, n_layers=1, d_model=8, n_heads=2, seq_len=4, ffn_widths=[8])
    )
    with pytest.raises(ValueError, match="exceeds seq_len"):
        model(torch.zeros(1, 5, dtype=torch.long))


#: Llama-architecture configs (hidden, intermediate, layers, heads, kv heads, vocab, tied): a
#: small one, SmolLM2-135M, Llama 3.2 1B and Llama 3 8B (their published config.json values).
LLAMA_CONFIGS = {
    "small-gqa": (64, 96, 3, 8, 2, 101, False),
    "smollm2-135m": (576, 1536, 30, 9, 3, 49152, True),
    "llama-3.2-1b": (2048, 8192, 16, 32, 8, 128256, True),
    "llama-3-8b": (4096, 14336, 32, 32, 8, 128256, False),
}


@pytest.mark.parametrize("name", list(LLAMA_CONFIGS))
def test_gqa_parameter_count_equals_transformers_llama(name: str) -> None:
    """count_params of a grouped-query Llama shape equals transformers' LlamaForCausalLM built from
    the same config (on the meta device: no memory, no download) and geospec's own built model."""
    from transformers import LlamaConfig, LlamaForCausalLM

    d, width, layers, heads, kv_heads, vocab, tied = LLAMA_CONFIGS[name]
    hf_config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=d,
        intermediate_size=width,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        tie_word_embeddings=tied,
    )
    config = GPTConfig(
        vocab_size=vocab,
        n_layers=layers,
        d_model=d,
        n_heads=heads,
        n_kv_heads=kv_heads,
        seq_len=64,
        ffn_widths=[width] * layers,
        activation="swiglu",
        norm="rmsnorm",
        positions="rope",
        bias=False,
        tie_embeddings=tied,
    )
    with torch.device("meta"):
        hf_count = sum(p.numel() for p in LlamaForCausalLM(hf_config).parameters())
        built = GPT(config).num_params()
    shape = Shape(
        n_layers=layers,
        d_model=d,
        n_heads=heads,
        n_kv_heads=kv_heads,
        vocab_size=vocab,
        seq_len=64,
        activation="swiglu",
        norm="rmsnorm",
        positions="rope",
        bias=False,
        tie_embeddings=tied,
    )
    assert count_params(shape, [width] * layers) == hf_count == built == config.num_params()


def test_gqa_model_matches_transformers_llama() -> None:
    """Grouped-query attention (8 query heads sharing 2 key/value heads) computes what Llama's
    does; qkv holds the query, key and value projections in that order."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(5)
    d, heads, kv_heads, widths = 48, 8, 2, [40, 40]
    config = GPTConfig(
        vocab_size=53,
        n_layers=2,
        d_model=d,
        n_heads=heads,
        n_kv_heads=kv_heads,
        seq_len=16,
        ffn_widths=widths,
        activation="swiglu",
        norm="rmsnorm",
        positions="rope",
        bias=False,
        tie_embeddings=False,
    )
    model = GPT(config).eval()
    hf = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=53,
            hidden_size=d,
            intermediate_size=40,
            num_hidden_layers=2,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            max_position_embeddings=16,
            rms_norm_eps=1e-6,
            rope_theta=10000.0,
            tie_word_embeddings=False,
        )
    ).eval()
    sd = model.state_dict()
    kv = d // heads * kv_heads
    out = {
        "model.embed_tokens.weight": sd["wte.weight"],
        "model.norm.weight": sd["norm_f.weight"],
        "lm_head.weight": sd["lm_head.weight"],
    }
    for layer in range(2):
        p, q = f"blocks.{layer}.", f"model.layers.{layer}."
        wq, wk, wv = sd[p + "attn.qkv.weight"].split([d, kv, kv])
        gate, up = sd[p + "ffn.fc.weight"].chunk(2)
        out |= {
            q + "input_layernorm.weight": sd[p + "norm1.weight"],
            q + "post_attention_layernorm.weight": sd[p + "norm2.weight"],
            q + "self_attn.q_proj.weight": wq,
            q + "self_attn.k_proj.weight": wk,
            q + "self_attn.v_proj.weight": wv,
            q + "self_attn.o_proj.weight": sd[p + "attn.proj.weight"],
            q + "mlp.gate_proj.weight": gate,
            q + "mlp.up_proj.weight": up,
            q + "mlp.down_proj.weight": sd[p + "ffn.proj.weight"],
        }
    hf.load_state_dict(out, strict=True)
    idx = torch.randint(0, 53, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(model(idx)[0], hf(idx).logits, atol=1e-5, rtol=1e-5)


def test_n_kv_heads_must_divide_heads() -> None:
    with pytest.raises(ValueError, match="n_kv_heads: 3 does not divide n_heads 4"):
        GPTConfig(
            vocab_size=10, n_layers=1, d_model=8, n_heads=4, n_kv_heads=3, seq_len=4, ffn_widths=[8]
        )
    config = GPTConfig(
        vocab_size=10, n_layers=1, d_model=8, n_heads=4, n_kv_heads=2, seq_len=4, ffn_widths=[8]
    )
    assert GPTConfig.from_dict(config.to_dict()) == config
    plain = GPTConfig(vocab_size=10, n_layers=1, d_model=8, n_heads=4, seq_len=4, ffn_widths=[8])
    assert "n_kv_heads" not in plain.to_dict()  # config.json of models without GQA is unchanged
