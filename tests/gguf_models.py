"""A tiny Llama with a byte-level BPE tokenizer (trained here on the bundled Austen text), cut to
uneven FFN widths: what the GGUF writer's tests export (nothing is downloaded)."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import torch
import transformers as hf
from tokenizers import Tokenizer

from geospec.engine.export import save_tokenizer
from geospec.engine.tokenizer import EOT, train_bpe
from geospec.measure.cut import cut_ffn
from geospec.spec.sections import BPETokenizer

VOCAB, WIDTH, FULL = 400, 64, 96
WIDTHS = [32, 96, 64]
TEXT = "It is a truth universally acknowledged, that a single man in possession of a good fortune"


def bpe_tokenizer(directory: Path) -> Tokenizer:
    """A 400-token byte-level BPE (GPT-2's pre-tokenizer), saved as transformers saves one."""
    from geospec.data import __file__ as data_init

    with gzip.open(Path(data_init).parent / "austen.txt.gz", "rt", encoding="utf-8") as file:
        text = file.read()[:200_000]
    tokenizer = train_bpe(
        BPETokenizer(vocab_size=VOCAB), [text[i : i + 2000] for i in range(0, len(text), 2000)]
    )
    save_tokenizer(tokenizer, tokenizer.token_to_id(EOT), directory)
    return tokenizer


def qwen2_bpe_tokenizer(directory: Path) -> Tokenizer:
    """A 400-token byte-level BPE trained (on the same Austen text) behind Qwen2's own split
    regex, saved as transformers saves one: its merges join what only Qwen2's pre-tokenizer
    keeps together (a quote and the word after it, a contraction in capitals), so a tokenizer
    that splits as GPT-2's does gives other ids."""
    from tokenizers import Regex, decoders, models, pre_tokenizers, trainers
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    from geospec.data import __file__ as data_init

    with gzip.open(Path(data_init).parent / "austen.txt.gz", "rt", encoding="utf-8") as file:
        text = file.read()[:200_000]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([text[i : i + 2000] for i in range(0, len(text), 2000)], trainer)
    save_tokenizer(tokenizer, tokenizer.token_to_id(EOT), directory)
    return tokenizer


def llama(
    eos: int,
    widths: list[int] | None = WIDTHS,
    tied: bool = False,
    seed: int = 0,
    hidden: int = WIDTH,
    full: int = FULL,
) -> torch.nn.Module:
    """A random 3-layer Llama (grouped-query attention, rope theta 500) with norms that are not
    their init, ``hidden`` wide with FFNs of ``full``, each layer cut to ``widths`` (its first
    neurons)."""
    torch.manual_seed(seed)
    config = hf.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=full,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        rms_norm_eps=1e-5,
        rope_theta=500.0,
        tie_word_embeddings=tied,
        bos_token_id=eos,
        eos_token_id=eos,
    )
    model = hf.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.add_(0.1 * torch.randn_like(parameter))
    for layer, width in zip(model.model.layers, widths or [], strict=False):
        cut_ffn(layer.mlp, range(width))
    return model


def qwen2_gguf(path: Path, model: torch.nn.Module, tokenizer_dir: Path, q8_0: bool = False) -> Path:
    """``model`` (a transformers Qwen2) written as llama.cpp's converter writes a Qwen2
    (convert_hf_to_gguf.py's ``Qwen2Model``: the ``qwen2`` architecture, its keys, the query and
    key rows as transformers has them, since llama.cpp's qwen2 ropes rotate-half pairs; the
    q/k/v biases), with the byte-level BPE of ``tokenizer_dir`` as llama.cpp's gpt2 tokenizer;
    matrices in f32 or Q8_0. transformers' GGUF loader reads it back (tests/test_qwen2.py)."""
    import json

    import gguf
    import numpy as np

    config: Any = model.config
    inner: Any = model.model
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(float(config.rope_parameters["rope_theta"]))
    file_type = gguf.LlamaFileType.MOSTLY_Q8_0 if q8_0 else gguf.LlamaFileType.ALL_F32
    writer.add_file_type(int(file_type))
    spec = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    special = {t["content"]: t["id"] for t in spec["added_tokens"]}
    by_id = {i: t for t, i in (dict(spec["model"]["vocab"]) | special).items()}
    tokens = [by_id[i] for i in range(config.vocab_size)]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    kinds = gguf.TokenType
    writer.add_token_types([kinds.CONTROL if t in special else kinds.NORMAL for t in tokens])
    gguf.SpecialVocab(tokenizer_dir, load_merges=True, n_vocab=config.vocab_size).add_to_gguf(
        writer, quiet=True
    )

    def add(name: str, tensor: torch.Tensor) -> None:
        values = tensor.detach().float().numpy()
        if q8_0 and values.ndim == 2:
            packed = gguf.quants.quantize(values, gguf.GGMLQuantizationType.Q8_0)
            writer.add_tensor(name, packed, raw_shape=packed.shape,
                              raw_dtype=gguf.GGMLQuantizationType.Q8_0)  # fmt: skip
        else:
            writer.add_tensor(name, values.astype(np.float32))

    add("token_embd.weight", inner.embed_tokens.weight)
    add("output_norm.weight", inner.norm.weight)
    if not config.tie_word_embeddings:
        add("output.weight", model.get_output_embeddings().weight)  # type: ignore[operator]
    for i, layer in enumerate(inner.layers):
        attention, mlp = layer.self_attn, layer.mlp
        add(f"blk.{i}.attn_norm.weight", layer.input_layernorm.weight)
        for name in ("q", "k", "v"):
            projection = getattr(attention, f"{name}_proj")
            add(f"blk.{i}.attn_{name}.weight", projection.weight)
            add(f"blk.{i}.attn_{name}.bias", projection.bias)
        add(f"blk.{i}.attn_output.weight", attention.o_proj.weight)
        add(f"blk.{i}.ffn_norm.weight", layer.post_attention_layernorm.weight)
        add(f"blk.{i}.ffn_gate.weight", mlp.gate_proj.weight)
        add(f"blk.{i}.ffn_up.weight", mlp.up_proj.weight)
        add(f"blk.{i}.ffn_down.weight", mlp.down_proj.weight)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
