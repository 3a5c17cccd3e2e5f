"""A tiny Llama with a byte-level BPE tokenizer (trained here on the bundled Austen text), cut to
uneven FFN widths: what the GGUF writer's tests export (nothing is downloaded)."""

from __future__ import annotations

import gzip
from pathlib import Path

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


def llama(
    eos: int, widths: list[int] | None = WIDTHS, tied: bool = False, seed: int = 0
) -> torch.nn.Module:
    """A random 3-layer Llama (grouped-query attention, rope theta 500) with norms that are not
    their init, each layer cut to ``widths`` (its first neurons)."""
    torch.manual_seed(seed)
    config = hf.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=WIDTH,
        intermediate_size=FULL,
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
