"""Tokenizers that start every text with a BOS token (Gemma's <bos>): every window a model
reads starts with it, and each window still scores its own seq_len tokens exactly once."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors

from geospec.engine.batches import input_windows, window_tensors
from geospec.engine.token_data import TokenData

pytestmark = [pytest.mark.torch]

VOCAB = {"[UNK]": 0, "<bos>": 1, "<eos>": 2} | {f"w{i}": i + 3 for i in range(20)}


def word_tokenizer(bos: bool) -> Tokenizer:
    tokenizer = Tokenizer(models.WordLevel(VOCAB, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if bos:
        tokenizer.post_processor = processors.TemplateProcessing(
            single="<bos> $A", special_tokens=[("<bos>", 1)]
        )
    return tokenizer


@pytest.mark.parametrize("bos", [True, False])
def test_the_bos_is_read_from_the_tokenizer(tmp_path: Path, bos: bool) -> None:
    word_tokenizer(bos).save(str(tmp_path / "tokenizer.json"))
    empty = np.zeros(0, dtype=np.uint16)
    data = TokenData(tmp_path, empty, empty, len(VOCAB), 2, {})
    assert data.bos_id == (1 if bos else None)


def test_windows_with_a_bos_score_the_same_tokens_once() -> None:
    tokens = np.arange(10, 30, dtype=np.uint16)  # 20 tokens: windows of 4 at 0, 4, 8, ...
    windows = np.array([0, 2])
    x, y = window_tensors(tokens, windows, 4)
    assert x.tolist() == [[10, 11, 12, 13], [18, 19, 20, 21]]
    assert y.tolist() == [[11, 12, 13, 14], [19, 20, 21, 22]]
    x, y = window_tensors(tokens, windows, 4, bos=1)
    assert x.tolist() == [[1, 10, 11, 12], [1, 18, 19, 20]]  # the first token predicted from BOS
    assert y.tolist() == [[10, 11, 12, 13], [18, 19, 20, 21]]
    # consecutive windows score every token once: window k's targets start at k x seq_len
    x, y = window_tensors(tokens, np.arange(4), 4, bos=1)
    assert y.flatten().tolist() == list(range(10, 26))
    ids = input_windows(tokens, [0, 8], 4, bos=1)
    assert torch.equal(ids, x[[0, 2]])
    assert input_windows(tokens, [0, 8], 4).tolist() == [[10, 11, 12, 13], [18, 19, 20, 21]]
