"""A pretrained Llama-family checkpoint as geospec's own model, with the same logits.

geospec's rope/rmsnorm/swiglu decoder is exactly Llama's (``geospec export`` maps one way:
:mod:`geospec.engine.export`); this maps the other way, so a pretrained (or pruned) Hugging Face
model can be trained further in geospec's engine, where every layer has its own FFN width
(healing a pruned model). Llama, Mistral without a sliding window, SmolLM2, Qwen2 without a
sliding window (its query, key and value projections have biases: ``GPTConfig.qkv_bias``) and
GGUF files that transformers loads as one of them are imported: grouped-query attention, tied or
untied embeddings, the checkpoint's rope theta and norm epsilon. Each layer keeps its own FFN
width (a pruned model's cut layers included), and so does a bias on the FFN's output (down)
projection: a repair's (``prune.repair``: mean compensation, the least-squares re-fit's
intercept), which a pruned model has on every layer (a zero one where a layer kept every neuron:
:func:`geospec.prune.cut.pruned`) and healing trains and carries (zero gate and up biases, as a
repaired Llama's export stores them, are dropped). A checkpoint whose computation geospec's
model does not reproduce (rope scaling, a bias on the attention's output projection or on only
some of its query, key and value projections, a down bias on only some layers, a non-zero gate
or up bias, another activation, a sliding window) is refused with one line saying what differs,
and :func:`import_problem` lets a caller check before importing.
"""

from __future__ import annotations

from typing import Any

import torch

from geospec.engine.model import GPT, GPTConfig
from geospec.errors import UsageError


def import_problem(model: Any) -> str | None:
    """Why geospec's model cannot compute what ``model`` does (None: it can)."""
    config = model.config
    if getattr(config, "model_type", None) not in FAMILIES:
        return f"a {getattr(config, 'model_type', type(model).__name__)} model (not Llama-family)"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"its activation is {config.hidden_act} (geospec's swiglu uses silu)"
    layers = getattr(getattr(model, "model", None), "layers", None) or []
    # read from the modules, not the config: Qwen2's config says nothing of its q/k/v biases
    qkv = {_has_bias(layer.self_attn, name) for layer in layers for name in QKV}
    if len(qkv) > 1:
        return "some of its query, key and value projections have biases and some do not"
    if any(_has_bias(layer.self_attn, "o_proj") for layer in layers):
        return "its attention output projection has a bias"
    for layer in layers:
        for name in ("gate_proj", "up_proj"):
            bias = getattr(getattr(layer.mlp, name), "bias", None)
            if bias is not None and bool(bias.detach().any()):
                return f"its MLP's {name} has a non-zero bias"
    down = [getattr(layer.mlp.down_proj, "bias", None) is not None for layer in layers]
    # a repair gives every layer one (prune.cut.pruned). A missing one is refused rather than
    # taken as zero: healing trains it, and load_into_llama would have nowhere to put it back
    if any(down) and not all(down):
        return "some of its FFN output projections have biases and some do not"
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


#: transformers model types whose decoder layer is geospec's rope/rmsnorm/swiglu block.
FAMILIES = ("llama", "mistral", "qwen2")
#: The attention's query, key and value projections (Qwen2's have biases).
QKV = ("q_proj", "k_proj", "v_proj")


def _has_bias(module: Any, name: str) -> bool:
    return getattr(getattr(module, name), "bias", None) is not None


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
    # a repair's bias (a zero one where a layer kept every neuron)
    out_bias = bool(layers) and layers[0].mlp.down_proj.bias is not None
    qkv_bias = bool(layers) and _has_bias(layers[0].self_attn, "q_proj")
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
        ffn_out_bias=out_bias,
        qkv_bias=qkv_bias,
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
        if out_bias:
            state[b + "ffn.proj.bias"] = source[h + "mlp.down_proj.bias"]
        if qkv_bias:
            state[b + "attn.qkv.bias"] = torch.cat(
                [source[h + f"self_attn.{p}_proj.bias"] for p in ("q", "k", "v")]
            )
    gpt = GPT(config)
    missing, unexpected = gpt.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise RuntimeError(f"import mapping incomplete: missing {missing}, unexpected {unexpected}")
    return gpt.eval()


def load_into_llama(model: Any, gpt: GPT) -> None:
    """Copy ``gpt``'s weights into ``model``, the Llama-family model it was imported from (by
    :func:`import_llama`) with the same widths: the way back, so that a pruned model healed in
    geospec's engine leaves as the transformers model it came in as. The shapes must match."""
    c = gpt.config
    layers = model.model.layers
    widths = [int(layer.mlp.down_proj.in_features) for layer in layers]
    if widths != c.ffn_widths:
        raise UsageError(f"the FFN widths {c.ffn_widths} are not the model's {widths}")
    out_bias = [layer.mlp.down_proj.bias is not None for layer in layers]
    if out_bias != [c.ffn_out_bias] * len(layers):
        raise UsageError("the FFN output biases of the healed model and the target differ")
    qkv_bias = [_has_bias(layer.self_attn, "q_proj") for layer in layers]
    if qkv_bias != [c.qkv_bias] * len(layers):
        raise UsageError("the attention biases of the healed model and the target differ")
    state = gpt.state_dict()
    d, kv = c.d_model, c.kv_width

    def put(target: torch.nn.Parameter, value: torch.Tensor) -> None:
        if target.shape != value.shape:
            raise UsageError(f"a weight of shape {tuple(value.shape)} for {tuple(target.shape)}")
        target.copy_(value.to(target.dtype))

    with torch.no_grad():
        put(model.model.embed_tokens.weight, state["wte.weight"])
        put(model.model.norm.weight, state["norm_f.weight"])
        if not c.tie_embeddings:
            put(model.lm_head.weight, state["lm_head.weight"])
        for i, layer in enumerate(layers):
            b = f"blocks.{i}."
            put(layer.input_layernorm.weight, state[b + "norm1.weight"])
            put(layer.post_attention_layernorm.weight, state[b + "norm2.weight"])
            q, k, v = state[b + "attn.qkv.weight"].split([d, kv, kv])
            put(layer.self_attn.q_proj.weight, q)
            put(layer.self_attn.k_proj.weight, k)
            put(layer.self_attn.v_proj.weight, v)
            put(layer.self_attn.o_proj.weight, state[b + "attn.proj.weight"])
            if c.qkv_bias:
                bq, bk, bv = state[b + "attn.qkv.bias"].split([d, kv, kv])
                put(layer.self_attn.q_proj.bias, bq)
                put(layer.self_attn.k_proj.bias, bk)
                put(layer.self_attn.v_proj.bias, bv)
            gate, up = state[b + "ffn.fc.weight"].chunk(2)
            put(layer.mlp.gate_proj.weight, gate)
            put(layer.mlp.up_proj.weight, up)
            put(layer.mlp.down_proj.weight, state[b + "ffn.proj.weight"])
            if c.ffn_out_bias:
                put(layer.mlp.down_proj.bias, state[b + "ffn.proj.bias"])
