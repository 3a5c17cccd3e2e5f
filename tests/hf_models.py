"""Tiny randomly initialised Hugging Face causal LMs built from configs (nothing is downloaded)."""

from __future__ import annotations

import torch
import transformers as hf

VOCAB, WIDTH, LAYERS = 97, 32, 3
SPECIAL_IDS = {"bos_token_id": 0, "eos_token_id": 1}


def llama(intermediate_size: int = 80, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = hf.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=WIDTH,
        intermediate_size=intermediate_size,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=2,
        **SPECIAL_IDS,
    )
    return hf.LlamaForCausalLM(config).eval()


def gpt2(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = hf.GPT2Config(
        vocab_size=VOCAB, n_embd=WIDTH, n_layer=LAYERS, n_head=4, n_positions=64, **SPECIAL_IDS
    )
    return hf.GPT2LMHeadModel(config).eval()


def gemma2(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = hf.Gemma2Config(
        vocab_size=VOCAB,
        hidden_size=WIDTH,
        intermediate_size=64,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
        pad_token_id=2,
        **SPECIAL_IDS,
    )
    return hf.Gemma2ForCausalLM(config).eval()


def gemma3(seed: int = 0) -> torch.nn.Module:
    """Gemma 3's text model (gemma-3-270m's family): sandwich norms, q/k norms, a sliding window
    on all but every sixth layer, a tanh-GELU gate."""
    torch.manual_seed(seed)
    config = hf.Gemma3TextConfig(
        vocab_size=VOCAB,
        hidden_size=WIDTH,
        intermediate_size=64,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=64,
        sliding_window=8,
        pad_token_id=2,
        **SPECIAL_IDS,
    )
    return hf.Gemma3ForCausalLM(config).eval()


def mistral(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = hf.MistralConfig(
        vocab_size=VOCAB,
        hidden_size=WIDTH,
        intermediate_size=48,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=2,
        **SPECIAL_IDS,
    )
    return hf.MistralForCausalLM(config).eval()


def qwen2(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = hf.Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=WIDTH,
        intermediate_size=56,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=2,
        **SPECIAL_IDS,
    )
    return hf.Qwen2ForCausalLM(config).eval()


def save_with_words(model: torch.nn.Module, directory: object) -> None:
    """``model`` and a word-level tokenizer (words w0..w94, "[UNK]" 0, "</s>" 1: the VOCAB ids)
    saved in one directory, as a pretrained checkpoint on disk is."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "</s>": 1} | {f"w{i}": i + 2 for i in range(VOCAB - 2)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    hf.PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="</s>", unk_token="[UNK]"
    ).save_pretrained(directory)
    model.save_pretrained(directory)
