"""The small study the training tests run, written once: a 2-layer model (d_model 32, FFN width
64, 32-token windows) on 100 documents of the bundled Austen corpus with a 300-token BPE, the arms
uniform and cosine 1.5 -> 0.5, no profile measured (the arms need none), one thread.

A test states only what it is about: its name, its [train] settings, and any table it adds
(``launch``, ``report``, ...) or changes (``model``, ``data``: updated key by key).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import tomlkit

MODEL = {
    "n_layers": 2,
    "d_model": 32,
    "n_heads": 2,
    "ffn_width": 64,
    "seq_len": 32,
    "multiple_of": 8,
}
DATA = {
    "source": "bundled:austen",
    "tokenizer": {"kind": "bpe", "vocab_size": 300},
    "max_documents": 100,
}
ARMS = {
    "uniform": {"name": "uniform", "schedule": {"kind": "uniform"}},
    "cosine": {"name": "cosine", "schedule": {"kind": "cosine", "start": 1.5, "end": 0.5}},
}
TRAIN = {"batch_size": 4, "lr": 3e-3, "eval_tokens": 1024, "threads": 1}


def small_spec(
    name: str,
    train: dict[str, Any],
    arms: tuple[str, ...] = ("uniform", "cosine"),
    **tables: Any,
) -> str:
    """The spec's TOML: ``train`` and ``model``/``data`` in ``tables`` update the defaults above;
    other ``tables`` (``out``, ``launch``, ``report``, ...) are added as they are."""
    model = MODEL | tables.pop("model", {})
    data = DATA | tables.pop("data", {})
    scalars = {key: value for key, value in tables.items() if not isinstance(value, dict)}
    others = {key: value for key, value in tables.items() if isinstance(value, dict)}
    document = {
        "name": name,
        "measure": [],
        **scalars,  # top-level keys go before the first table
        "model": model,
        "data": data,
        "arms": [ARMS[arm] for arm in arms],
        "train": TRAIN | train,
        **others,
    }
    return tomlkit.dumps(document)


def write_small_spec(
    directory: Path, name: str, train: dict[str, Any], file: str = "spec.toml", **tables: Any
) -> Path:
    """:func:`small_spec` written to ``directory / file``."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / file
    path.write_text(small_spec(name, train, **tables))
    return path


def toml_value(text: str) -> Any:
    """A TOML value written as text (an inline table such as ``{ kind = "wandb" }``)."""
    return tomlkit.parse(f"value = {text}")["value"]
