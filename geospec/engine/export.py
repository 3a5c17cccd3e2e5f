"""A trained geospec model as a Hugging Face transformers checkpoint.

geospec's decoder is exactly one of two transformers architectures (docs/engine.md):

- learned positions, layernorm, gelu (tanh approximation): ``GPT2LMHeadModel``. GPT-2's
  ``Conv1D`` stores weights transposed; its fused ``c_attn`` holds q, k, v in geospec's order;
  a model trained without biases is exported with zero biases (the same function).
- rotary positions, rmsnorm, swiglu: ``LlamaForCausalLM`` (rotate-half RoPE with the same theta,
  rmsnorm eps 1e-6, grouped-query attention; geospec's ``ffn.fc`` holds the gate half, then the
  up half; biases map to ``attention_bias`` and ``mlp_bias``).

Per-layer FFN widths. transformers builds every MLP of these models at one width (its
``per_layer_config`` exists, but Llama's and GPT-2's modeling read the global
``intermediate_size`` and refuse a heterogeneous config). So each layer's FFN is zero-padded to
the widest layer's width: a padded unit has zero input weights and bias and a zero output column,
so it adds exactly 0 for gelu (gelu(0) = 0) and swiglu (silu(0) * 0 = 0) and the logits are
unchanged. The padded checkpoint therefore states more parameters and FLOPs than the model has;
the true widths are kept in the config's ``geospec`` block. :func:`native_per_layer_widths` detects
a transformers that builds per-layer MLPs; there the export is unpadded, with ``per_layer_config``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
from tokenizers import Tokenizer

from geospec.engine.model import GPT, LAYERNORM_EPS, RMSNORM_EPS, GPTConfig
from geospec.errors import UsageError
from geospec.storage.atomic import check_new_directory
from geospec.storage.disk import writing
from geospec.version import __version__

GPT2 = "gpt2"
LLAMA = "llama"

#: Tensors by name: a state dict, one block's tensors, or an export's weights.
Tensors = dict[str, torch.Tensor]


def family(config: GPTConfig) -> str:
    """The transformers architecture that computes exactly what ``config`` does."""
    choice = (config.positions, config.norm, config.activation)
    if choice == ("learned", "layernorm", "gelu") and config.n_kv_heads in (None, config.n_heads):
        return GPT2
    if choice == ("rope", "rmsnorm", "swiglu"):
        return LLAMA
    raise UsageError(
        f"a model with {config.positions} positions, {config.norm} and {config.activation} has "
        "no transformers equivalent; geospec exports learned/layernorm/gelu (GPT-2) and "
        "rope/rmsnorm/swiglu (Llama) models"
    )


def native_per_layer_widths(kind: str) -> bool:
    """Whether the installed transformers builds each layer's MLP at its own width from
    ``per_layer_config`` (tried on a two-layer model on the meta device)."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    key = "n_inner" if kind == GPT2 else "intermediate_size"
    common: dict[str, Any] = {"vocab_size": 8, "per_layer_config": {0: {key: 4}, 1: {key: 12}}}
    try:
        with torch.device("meta"):
            if kind == GPT2:
                gpt2: Any = GPT2LMHeadModel(GPT2Config(n_embd=8, n_layer=2, n_head=2, **common))
                widths = [block.mlp.c_fc.nf for block in gpt2.transformer.h]
            else:
                llama: Any = LlamaForCausalLM(
                    LlamaConfig(hidden_size=8, num_hidden_layers=2, num_attention_heads=2, **common)
                )
                widths = [layer.mlp.gate_proj.out_features for layer in llama.model.layers]
    except Exception:  # any refusal means "not supported"
        return False
    return widths == [4, 12]


@dataclass(frozen=True)
class Exported:
    """What :func:`to_transformers` built: the model and how its FFNs were stored."""

    model: Any
    """The transformers model (``GPT2LMHeadModel`` or ``LlamaForCausalLM``), in eval mode."""
    family: str
    widths: list[int]
    padded_to: int | None
    """The common FFN width of the padded checkpoint (None: stored at the true widths)."""


def to_transformers(model: GPT, eos_token_id: int, native: bool | None = None) -> Exported:
    """The transformers model computing the same logits as ``model`` (float32 on the CPU).

    ``native``: store per-layer widths through ``per_layer_config`` (default: when the installed
    transformers supports it, see :func:`native_per_layer_widths`)."""
    config = model.config
    kind = family(config)
    widths = list(config.ffn_widths)
    if native is None:
        native = len(set(widths)) > 1 and native_per_layer_widths(kind)
    uniform = len(set(widths)) == 1
    padded_to = None if native or uniform else max(widths)
    stored = widths if native else [max(widths)] * len(widths)
    state = {k: v.detach().to("cpu", torch.float32) for k, v in model.state_dict().items()}
    blocks = [_block_weights(state, i, config, stored[i]) for i in range(config.n_layers)]
    per_layer = (
        {i: {_width_key(kind): w} for i, w in enumerate(widths)} if native and not uniform else None
    )
    built = (_gpt2 if kind == GPT2 else _llama)(config, state, blocks, stored[0])
    hf_config = built.model_class.config_class(  # what every family's config says alike
        vocab_size=config.vocab_size,
        tie_word_embeddings=config.tie_embeddings,
        bos_token_id=eos_token_id,
        eos_token_id=eos_token_id,
        **built.config,
        **({"per_layer_config": per_layer} if per_layer else {}),
    )
    weights = built.weights
    if not config.tie_embeddings:
        weights["lm_head.weight"] = state["lm_head.weight"]
    hf: Any = built.model_class(hf_config)
    missing, unexpected = hf.load_state_dict(weights, strict=False)
    tied = {"lm_head.weight"} if config.tie_embeddings else set()
    if unexpected or set(missing) - tied:
        raise RuntimeError(f"export mapping incomplete: missing {missing}, unexpected {unexpected}")
    hf.config.geospec = {
        "version": __version__,
        "ffn_widths": widths,
        "padded_to": padded_to,
        "note": (
            "FFN layers zero-padded to one width: the padded units contribute exactly zero, but "
            "this checkpoint's parameter count and FLOPs overstate the model's"
            if padded_to is not None
            else "FFN layers stored at their true widths"
        ),
    }
    return Exported(hf.eval(), kind, widths, padded_to)


def _width_key(kind: str) -> str:
    return "n_inner" if kind == GPT2 else "intermediate_size"


class _Built(NamedTuple):
    """One family's part of an export: its transformers model class, the config arguments of
    its own (the vocabulary, tied embeddings, end of text and per-layer widths are said alike
    for every family) and its weights by transformers' names (the untied lm_head added alike)."""

    model_class: Any
    config: dict[str, Any]
    weights: Tensors


def _block_weights(state: Tensors, layer: int, config: GPTConfig, width: int) -> Tensors:
    """Layer ``layer``'s tensors with its FFN zero-padded to ``width`` hidden units; missing
    biases (a model without bias) are zeros, which is what a bias-free layer computes."""
    d, own = config.d_model, config.ffn_widths[layer]
    p = f"blocks.{layer}."

    def get(name: str, shape: tuple[int, ...]) -> torch.Tensor:
        return state.get(p + name, torch.zeros(shape))

    def pad_rows(t: torch.Tensor) -> torch.Tensor:
        return torch.cat([t, t.new_zeros((width - own, *t.shape[1:]))])

    fc_w, fc_b = (
        state[p + "ffn.fc.weight"],
        get("ffn.fc.bias", (state[p + "ffn.fc.weight"].shape[0],)),
    )
    if config.activation == "swiglu":
        gate_w, up_w = fc_w.chunk(2)
        gate_b, up_b = fc_b.chunk(2)
        ffn = {"gate.w": pad_rows(gate_w), "gate.b": pad_rows(gate_b)}
        ffn |= {"up.w": pad_rows(up_w), "up.b": pad_rows(up_b)}
    else:
        ffn = {"fc.w": pad_rows(fc_w), "fc.b": pad_rows(fc_b)}
    down = state[p + "ffn.proj.weight"]
    ffn["down.w"] = torch.cat([down, down.new_zeros(d, width - own)], dim=1)
    ffn["down.b"] = get("ffn.proj.bias", (d,))
    qkv_w = state[p + "attn.qkv.weight"]
    return {
        "norm1.w": state[p + "norm1.weight"],
        "norm1.b": get("norm1.bias", (d,)),
        "norm2.w": state[p + "norm2.weight"],
        "norm2.b": get("norm2.bias", (d,)),
        "qkv.w": qkv_w,
        "qkv.b": get("attn.qkv.bias", (qkv_w.shape[0],)),
        "proj.w": state[p + "attn.proj.weight"],
        "proj.b": get("attn.proj.bias", (d,)),
        **ffn,
    }


def _gpt2(config: GPTConfig, state: Tensors, blocks: list[Tensors], width: int) -> _Built:
    from transformers import GPT2LMHeadModel

    own: dict[str, Any] = dict(
        n_positions=config.seq_len,
        n_embd=config.d_model,
        n_layer=config.n_layers,
        n_head=config.n_heads,
        n_inner=width,
        activation_function="gelu_new",  # GPT-2's tanh approximation, as geospec's gelu
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        layer_norm_epsilon=config.norm_eps or LAYERNORM_EPS,
    )
    weights = {
        "transformer.wte.weight": state["wte.weight"],
        "transformer.wpe.weight": state["wpe.weight"],
        "transformer.ln_f.weight": state["norm_f.weight"],
        "transformer.ln_f.bias": state.get("norm_f.bias", torch.zeros(config.d_model)),
    }
    for i, b in enumerate(blocks):
        h = f"transformer.h.{i}."
        weights |= {  # Conv1D computes x @ W + b: weights are stored (in, out)
            h + "ln_1.weight": b["norm1.w"],
            h + "ln_1.bias": b["norm1.b"],
            h + "ln_2.weight": b["norm2.w"],
            h + "ln_2.bias": b["norm2.b"],
            h + "attn.c_attn.weight": b["qkv.w"].T.contiguous(),
            h + "attn.c_attn.bias": b["qkv.b"],
            h + "attn.c_proj.weight": b["proj.w"].T.contiguous(),
            h + "attn.c_proj.bias": b["proj.b"],
            h + "mlp.c_fc.weight": b["fc.w"].T.contiguous(),
            h + "mlp.c_fc.bias": b["fc.b"],
            h + "mlp.c_proj.weight": b["down.w"].T.contiguous(),
            h + "mlp.c_proj.bias": b["down.b"],
        }
    return _Built(GPT2LMHeadModel, own, weights)


def _llama(config: GPTConfig, state: Tensors, blocks: list[Tensors], width: int) -> _Built:
    from transformers import LlamaForCausalLM

    own: dict[str, Any] = dict(
        hidden_size=config.d_model,
        intermediate_size=width,
        num_hidden_layers=config.n_layers,
        num_attention_heads=config.n_heads,
        num_key_value_heads=config.n_kv_heads or config.n_heads,
        head_dim=config.head_dim,
        max_position_embeddings=config.seq_len,
        rms_norm_eps=config.norm_eps or RMSNORM_EPS,
        hidden_act="silu",
        attention_bias=config.bias or config.qkv_bias,  # the latter: a zero o_proj bias
        mlp_bias=config.bias or config.ffn_out_bias,
        rope_theta=config.rope_theta,  # transformers 5 reads it into rope_parameters
    )
    weights = {
        "model.embed_tokens.weight": state["wte.weight"],
        "model.norm.weight": state["norm_f.weight"],
    }
    d, kv = config.d_model, config.kv_width
    for i, b in enumerate(blocks):
        q = f"model.layers.{i}."
        wq, wk, wv = b["qkv.w"].split([d, kv, kv])
        weights |= {
            q + "input_layernorm.weight": b["norm1.w"],
            q + "post_attention_layernorm.weight": b["norm2.w"],
            q + "self_attn.q_proj.weight": wq,
            q + "self_attn.k_proj.weight": wk,
            q + "self_attn.v_proj.weight": wv,
            q + "self_attn.o_proj.weight": b["proj.w"],
            q + "mlp.gate_proj.weight": b["gate.w"],
            q + "mlp.up_proj.weight": b["up.w"],
            q + "mlp.down_proj.weight": b["down.w"],
        }
        if config.bias or config.qkv_bias:
            bq, bk, bv = b["qkv.b"].split([d, kv, kv])
            weights |= {
                q + "self_attn.q_proj.bias": bq,
                q + "self_attn.k_proj.bias": bk,
                q + "self_attn.v_proj.bias": bv,
                q + "self_attn.o_proj.bias": b["proj.b"],
            }
        if config.bias or config.ffn_out_bias:  # the latter: zero gate and up biases
            weights |= {
                q + "mlp.gate_proj.bias": b["gate.b"],
                q + "mlp.up_proj.bias": b["up.b"],
                q + "mlp.down_proj.bias": b["down.b"],
            }
    return _Built(LlamaForCausalLM, own, weights)


def save_tokenizer(tokenizer: Tokenizer, eos_token_id: int, out: Path) -> None:
    """The run's tokenizer as a transformers fast tokenizer (tokenizer.json and its config),
    its end-of-text token as eos and bos (how geospec separates documents)."""
    from transformers import PreTrainedTokenizerFast

    eos = tokenizer.id_to_token(eos_token_id)
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=eos, bos_token=eos)
    wrapped.save_pretrained(str(out))


def _finished(result_path: Path) -> bool:
    """The trainer writes result.json last, with the final validation loss."""
    import json

    try:
        result = json.loads(result_path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(result, dict) and "final_val_loss" in result


def run_tokenizer(training_dir: Path) -> tuple[Tokenizer, int]:
    """The tokenizer a finished run trained on, and its end-of-text id: ``tokenizer.json`` of the
    token cache its result.json names (the shared cache, or the run directory's own data/)."""
    import json

    from geospec.engine.run_files import RESULT_FILE
    from geospec.engine.token_data import META_FILE, shared_cache_dir

    result = json.loads((training_dir / RESULT_FILE).read_text())
    key = str((result.get("fingerprint") or {}).get("data", ""))
    candidates = [shared_cache_dir() / key]
    if training_dir.resolve().parent.parent.name == "arms":  # RUN_DIR/arms/ARM/seed-K
        candidates.insert(0, training_dir.resolve().parents[2] / "data" / key)
    for directory in candidates:
        if key and (directory / "tokenizer.json").is_file() and (directory / META_FILE).is_file():
            meta = json.loads((directory / META_FILE).read_text())
            return Tokenizer.from_file(str(directory / "tokenizer.json")), int(meta["eot_id"])
    raise UsageError(
        f"{training_dir}: the tokens it was trained on ({key or 'unknown'}) are not in the token "
        f"cache ({shared_cache_dir()}); prepare them again (geospec run SPEC --until reference) "
        "or give --tokenizer DIR with the run's tokenizer.json"
    )


def training_model(
    training_dir: Path, tokenizer_dir: Path | None = None
) -> tuple[Exported, Tokenizer, int]:
    """The finished run in ``training_dir`` as a transformers model (:func:`to_transformers`), its
    tokenizer and end-of-text id. The weights are checked against the hash in its result.json;
    an unfinished run is refused, and a prune unit is pointed to what exports it."""
    import json

    from geospec.engine.checkpoint import DamagedCheckpoint, load_model
    from geospec.engine.run_files import MODEL_FILE, RESULT_FILE
    from geospec.engine.token_data import META_FILE

    if not training_dir.is_dir():
        raise UsageError(f"{training_dir}: no such training directory")
    if not _finished(training_dir / RESULT_FILE):
        raise UsageError(
            f"{training_dir}: the run has not finished (no readable {RESULT_FILE}); finish it "
            "with geospec run or geospec train, then export"
        )
    if not (training_dir / MODEL_FILE).is_file():
        raise UsageError(f"{training_dir}: no {MODEL_FILE}")
    if tokenizer_dir is not None:
        if not (tokenizer_dir / "tokenizer.json").is_file():
            raise UsageError(f"--tokenizer {tokenizer_dir}: no tokenizer.json there")
        tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
        meta_path = tokenizer_dir / META_FILE
        eot = int(json.loads(meta_path.read_text())["eot_id"]) if meta_path.is_file() else None
        if eot is None:
            raise UsageError(f"--tokenizer {tokenizer_dir}: no {META_FILE} naming its eot_id")
    else:
        tokenizer, eot = run_tokenizer(training_dir)
    try:
        model = load_model(training_dir)  # checks the weights against result.json's hash
    except DamagedCheckpoint as error:
        raise UsageError(f"{error}; refusing to export it") from None
    return to_transformers(model, eot), tokenizer, eot


def export_training_dir(
    training_dir: Path, to: Path, tokenizer_dir: Path | None = None
) -> Exported:
    """Write the finished run in ``training_dir`` to the new directory ``to`` as a transformers
    checkpoint (config.json, model.safetensors, tokenizer files); see :func:`training_model`."""
    import shutil
    import tempfile

    check_new_directory(to, f"--to {to}")
    exported, tokenizer, eot = training_model(training_dir, tokenizer_dir)
    with writing(to):  # a full disk: one line, and the scratch directory goes
        to.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".{to.name}.", dir=to.parent))
        try:
            exported.model.save_pretrained(str(work))
            save_tokenizer(tokenizer, eot, work)
            work.chmod(0o755)
            if to.exists():
                to.rmdir()  # empty (checked above)
            work.rename(to)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return exported
