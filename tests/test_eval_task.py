"""The bundled offline task geospec_austen_lastword: held out from the tiny spec's training
split, and exactly what the corpus gives (no lm-eval needed)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from geospec.engine.corpus import Corpus
from geospec.engine.token_data import split_fractions
from geospec.evaluate.tasks import (
    AUSTEN_LASTWORD_FILE,
    MAX_WORDS,
    MIN_WORDS,
    last_word_passages,
    write_austen_lastword,
)
from geospec.spec.loading import load_spec

pytestmark = pytest.mark.torch
TINY = Path(__file__).resolve().parents[1] / "specs" / "tiny.toml"


def examples() -> list[str]:
    return [json.loads(line)["text"] for line in AUSTEN_LASTWORD_FILE.read_text().splitlines()]


def flat(text: str) -> str:
    return " ".join(text.split())


def test_no_example_occurs_in_the_tiny_specs_training_split() -> None:
    """The tiny spec's documents split as training reads them (a document is in validation when
    its split number is below val_fraction); every example is found in the validation text and
    nowhere in the training text."""
    data = load_spec(TINY).data
    documents = [doc for batch in Corpus(data).batches() for doc in batch]
    is_val = split_fractions(np.arange(len(documents)), data.split_seed) < data.val_fraction
    train = flat(" ".join(d for d, v in zip(documents, is_val, strict=True) if not v))
    val = flat(" ".join(d for d, v in zip(documents, is_val, strict=True) if v))
    texts = examples()
    assert len(texts) >= 200
    assert [t for t in texts if t in train] == []
    assert [t for t in texts if t not in val] == []


def test_the_shipped_examples_are_rebuilt_from_the_corpus(tmp_path: Path) -> None:
    count = write_austen_lastword(tmp_path / "rebuilt.jsonl")
    assert count == len(examples())
    assert (tmp_path / "rebuilt.jsonl").read_bytes() == AUSTEN_LASTWORD_FILE.read_bytes()


def test_an_example_is_a_paragraph_cut_after_its_last_word() -> None:
    words = " ".join(f"w{i}" for i in range(MIN_WORDS - 1))
    document = (
        f"{words} said Elinor.\n\n"  # MIN_WORDS + 1 words, closing punctuation cut
        f"{words} it--\n\n"  # the last word is too short
        f"{words} Marianne, 1811\n\n"  # ends with a number
        f"short paragraph here.\n\n"  # too few words
        f"{' '.join(['x'] * MAX_WORDS)} end.\n\n"  # too many words
        f'{words}\n"said   Willoughby!"'  # whitespace collapsed, "!" and the quote cut
    )
    assert list(last_word_passages([document])) == [
        {"text": f"{words} said Elinor"},
        {"text": f'{words} "said Willoughby'},
    ]
    for text in examples():
        assert MIN_WORDS <= len(text.split()) <= MAX_WORDS
        assert re.fullmatch(r"[A-Za-z]{3,}", text.split()[-1])
