"""The bundled offline task: ``geospec_austen_lastword``, LAMBADA's format on held-out Austen.

Each example is one paragraph of Jane Austen whose last word is to be predicted from the rest
(``text`` is the paragraph with its closing punctuation cut, like LAMBADA's; the task YAML
splits off the last word exactly as lm-eval's ``lambada_openai`` does). Unlike LAMBADA, whose
passages were chosen by people as guessable only from the wider context, every paragraph of a
suitable length counts: the task measures a small model's next-word prediction on unseen text of
its training domain (accuracy and perplexity of the last word), not long-range comprehension.

Held out: the paragraphs come only from documents (chapters) of the bundled corpus that the
default data split (``data.val_fraction`` 0.05, ``data.split_seed`` 0; the tiny spec's) puts in
the validation split, which no model is trained on. Documents go to one split whole, so no
training text shares a paragraph with the task; tests/test_eval_task.py checks that no passage
occurs in the training split. Specs that split the corpus otherwise may have trained on them.

The examples are shipped (``geospec/data/tasks/austen_lastword/austen_lastword.jsonl``) rather
than rebuilt, so the task stays the same whatever changes in geospec's corpus reader;
``python -m geospec.evaluate.tasks`` writes the file again from the corpus.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from importlib import resources
from pathlib import Path
from typing import Any

#: The folder of task YAMLs bundled with geospec (always on lm-eval's include path).
TASKS_DIR = Path(str(resources.files("geospec") / "data" / "tasks"))
AUSTEN_LASTWORD = "geospec_austen_lastword"
AUSTEN_LASTWORD_FILE = TASKS_DIR / "austen_lastword" / "austen_lastword.jsonl"

#: Paragraph length in words: long enough to give context, short enough for a small window
#: (longer contexts are cut from the left by lm-eval to the model's length).
MIN_WORDS, MAX_WORDS = 20, 100
#: The last word (letters only) and what may follow it (closing punctuation and quotes).
_LAST_WORD = re.compile(r"^(?P<context>.*\S) (?P<word>[A-Za-z]{3,})[^A-Za-z0-9]*$")


def last_word_passages(documents: Iterable[str]) -> Iterator[dict[str, str]]:
    """LAMBADA-style examples from documents: every paragraph (blank-line separated, whitespace
    collapsed) of MIN_WORDS to MAX_WORDS words whose last word has 3 letters or more and is
    followed by nothing but punctuation; ``text`` ends with that word."""
    for document in documents:
        for paragraph in re.split(r"\n\s*\n", document):
            words = paragraph.split()
            if not MIN_WORDS <= len(words) <= MAX_WORDS:
                continue
            match = _LAST_WORD.match(" ".join(words))
            if match is None:
                continue
            yield {"text": f"{match['context']} {match['word']}"}


def validation_documents(val_fraction: float = 0.05, split_seed: int = 0) -> list[str]:
    """The bundled Austen chapters the data split puts in validation (the default split's)."""
    import numpy as np

    from geospec.engine.corpus import Corpus
    from geospec.engine.split import split_fractions
    from geospec.spec.sections import DataSpec

    data = DataSpec(source="bundled:austen", val_fraction=val_fraction, split_seed=split_seed)
    held_out: list[str] = []
    start = 0
    for batch in Corpus(data).batches():
        is_val = split_fractions(np.arange(start, start + len(batch)), split_seed) < val_fraction
        held_out += [text for text, val in zip(batch, is_val, strict=True) if val]
        start += len(batch)
    return held_out


def load_austen_lastword(**_: Any) -> Any:
    """The task's dataset for lm-eval (the YAML's ``custom_dataset``): the shipped examples as
    a ``test`` split. lm-eval passes the task's metadata, which this task does not need."""
    import datasets

    rows = [json.loads(line) for line in AUSTEN_LASTWORD_FILE.read_text().splitlines() if line]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


def write_austen_lastword(path: Path = AUSTEN_LASTWORD_FILE) -> int:
    """Write the task's examples from the corpus; returns how many."""
    from geospec.storage.atomic import atomic_write_text

    rows = list(last_word_passages(validation_documents()))
    atomic_write_text(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    return len(rows)


if __name__ == "__main__":  # pragma: no cover
    print(f"{write_austen_lastword()} examples -> {AUSTEN_LASTWORD_FILE}")
