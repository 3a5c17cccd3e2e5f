"""A pretrained Llama-family checkpoint as geospec's own model, with the same logits.

geospec's rope/rmsnorm/swiglu decoder is exactly Llama's (``geospec export`` maps one way:
:mod:`geospec.engine.export`); this maps the other way, so a pretrained (or pruned) Hugging Face
model can be trained further in geospec's engine, where every layer has its own FFN width
(healing a pruned model). Llama, Mistral without a sliding window, SmolLM2 and GGUF files that
transformers loads as one of them are imported: grouped-query attention, tied or untied
embeddings, the checkpoint's rope theta and norm epsilon. Each layer keeps its own FFN width (a
pruned model's cut layers included). A checkpoint whose computation geospec's model does not
reproduce (rope scaling, biases, another activation, a sliding window) is refused with one line
saying what differs, and :func:`import_problem` lets a caller check before importing.
"""

from __future__ import annotations

from typing import Any

import torch

from geospec.engine.model import GPT, GPTConfig
from geospec.errors import UsageError


def import_problem(model: Any) -> str | None:
    """Why geospec's model cannot compute what ``model`` does (None: it can)."""
    config = model.config
    if getattr(config, "model_type", None) not in ("llama", "mistral"):
        return f"a {getattr(config, 'model_type', type(model).__name__)} model (not Llama-family)"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"its activation is {config.hidden_act} (geospec's swiglu uses silu)"
    if getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False):
        return "it has attention or MLP biases"
    layers = getattr(getattr(model, "model", None), "layers", None) or []
    if any(getattr(layer.mlp.down_proj, "bias", None) is not None for layer in layers):
        # a pruned model's compensation (prune.compensate) puts a bias on the down projection
        return "its FFN output projections have biases (bias compensation)"
    # transformers 5 keeps rope_type in rope_parameters; 4.x a rope_scaling table (or None)
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind != "default":
        return f"it scales its rotary embeddings ({kind})"
    if getattr(config, "sliding_window", None):
        return f"it attends within a sliding window of {config.sliding_window} tokens"
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if head_dim * config.num_attention_heads != config.hidden_size:
        return "its heads are not hidden_size / num_attention_heads wide"
    return None


def rope_theta(config: Any) -> float:
    rope = getattr(config, "rope_parameters", None) or {}
    return float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0)))


def import_llama(model: Any, seq_len: int) -> GPT:
    """``model`` (a Llama-family causal LM) as a geospec :class:`GPT` with ``seq_len``-token
    rotary tables, in float32 on the CPU, in eval mode."""
    problem = import_problem(model)
    if problem is not None:
        raise UsageError(f"cannot import this checkpoint into geospec's model: {problem}")
    c = model.config
    layers = model.model.layers
    widths = [int(layer.mlp.down_proj.in_features) for layer in layers]
    config = GPTConfig(
        vocab_size=c.vocab_size,
        n_layers=len(layers),
        d_model=c.hidden_size,
        n_heads=c.num_attention_heads,
        n_kv_heads=c.num_key_value_heads,
        seq_len=seq_len,
        ffn_widths=widths,
        activation="swiglu",
        norm="rmsnorm",
        positions="rope",
        rope_theta=rope_theta(c),
        bias=False,
        tie_embeddings=bool(c.tie_word_embeddings),
        norm_eps=float(c.rms_norm_eps),
    )
    source = {k: v.detach().to("cpu", torch.float32) for k, v in model.state_dict().items()}
    state = {"wte.weight": source["model.embed_tokens.weight"]}
    state["norm_f.weight"] = source["model.norm.weight"]
    state["lm_head.weight"] = source.get("lm_head.weight", state["wte.weight"])
    for i in range(len(layers)):
        h, b = f"model.layers.{i}.", f"blocks.{i}."
        state |= {
            b + "norm1.weight": source[h + "input_layernorm.weight"],
            b + "norm2.weight": source[h + "post_attention_layernorm.weight"],
            b + "attn.qkv.weight": torch.cat(
                [source[h + f"self_attn.{p}_proj.weight"] for p in ("q", "k", "v")]
            ),
            b + "attn.proj.weight": source[h + "self_attn.o_proj.weight"],
            b + "ffn.fc.weight": torch.cat(
                [source[h + "mlp.gate_proj.weight"], source[h + "mlp.up_proj.weight"]]
            ),
            b + "ffn.proj.weight": source[h + "mlp.down_proj.weight"],
        }
    gpt = GPT(config)
    missing, unexpected = gpt.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise RuntimeError(f"import mapping incomplete: missing {missing}, unexpected {unexpected}")
    return gpt.eval()
