"""Malformed specs: every one exits 2 with one message naming the offending key, no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from geospec.cli import cli

VALID = """\
name = "t"

[model]
n_layers = 4
d_model = 64
n_heads = 4
ffn_width = 128
seq_len = 32
multiple_of = 16

[data]
tokenizer = { kind = "bpe", vocab_size = 512 }

[[arms]]
name = "uniform"
schedule = { kind = "uniform" }

[[arms]]
name = "taper"
schedule = { kind = "cosine", start = 1.5, end = 0.5 }

[train]
steps = 10
batch_size = 4
lr = 3e-3
seeds = [0, 1]
"""


def replace(old: str, new: str) -> bytes:
    assert old in VALID, old
    return VALID.replace(old, new, 1).encode()


def compare(pairs: str) -> bytes:
    """VALID with report.compare set to ``pairs`` (TOML)."""
    return VALID.encode() + f"\n[report]\ncompare = {pairs}\n".encode()


# (spec bytes, text the message must contain)
MALFORMED: list[tuple[str, bytes, str]] = [
    ("empty file", b"", "empty"),
    ("only whitespace", b"  \n\n", "empty"),
    ("binary garbage", bytes(range(256)) * 4, "UTF-8"),
    ("NUL bytes", b'name = "t"\x00\n', "NUL"),
    ("non-UTF-8 latin-1", 'name = "caf\xe9"\n'.encode("latin-1"), "UTF-8"),
    ("unterminated string", replace('name = "t"', 'name = "t'), ":1:"),
    ("missing value", replace("n_layers = 4", "n_layers ="), ":4:"),
    ("duplicate key", replace("n_layers = 4", "n_layers = 4\nn_layers = 5"), ":5:1: 'n_layers'"),
    ("bad table header", replace("[model]", "[model"), ":3:"),
    ("missing name", replace('name = "t"\n', ""), "name: required key is missing"),
    ("missing model", replace("[model]", "[modelx]"), "model: required key is missing"),
    ("missing train", replace("[train]", "[trainx]"), "train: required key is missing"),
    ("no arms", VALID.split("[[arms]]")[0].encode() + b"[train]\nsteps = 1\n", "arms"),
    (
        "arms empty",
        b"arms = []\n" + VALID.split("[[arms]]")[0].encode() + b"[train]\nsteps = 1\n",
        "arms: lists no arm",
    ),
    ("unknown top key", replace('name = "t"', 'name = "t"\nnmae = 1'), "nmae: unknown key"),
    ("unknown model key", replace("n_layers = 4", "n_layer = 4"), "model.n_layer: unknown key"),
    ("did you mean", replace("d_model = 64", "d_modle = 64"), "did you mean 'd_model'"),
    ("wrong type int", replace("n_layers = 4", 'n_layers = "four"'), "model.n_layers"),
    ("float for int", replace("n_layers = 4", "n_layers = 4.5"), "model.n_layers"),
    ("negative width", replace("ffn_width = 128", "ffn_width = -128"), "model.ffn_width"),
    ("absurd layers", replace("n_layers = 4", "n_layers = 100000000000"), "model.n_layers"),
    ("absurd lr", replace("lr = 3e-3", "lr = 1e300"), "train.lr"),
    ("nan lr", replace("lr = 3e-3", "lr = nan"), "train.lr"),
    ("inf lr", replace("lr = 3e-3", "lr = inf"), "train.lr"),
    ("zero steps", replace("steps = 10", "steps = 0"), "train.steps"),
    ("steps and tokens", replace("steps = 10", "steps = 10\ntokens = 100"), "train"),
    (
        "unknown activation",
        replace("seq_len = 32", 'seq_len = 32\nactivation = "relu"'),
        "model.activation",
    ),
    ("unknown schedule", replace('kind = "cosine"', 'kind = "cosin"'), "did you mean 'cosine'"),
    ("unknown schedule param", replace("end = 0.5", "ned = 0.5"), "arms[1].schedule.ned"),
    ("bad schedule value", replace("start = 1.5", "start = -1"), "arms[1].schedule.start"),
    (
        "schedule not a table",
        replace('schedule = { kind = "uniform" }', "schedule = 3"),
        "arms[0].schedule",
    ),
    (
        "schedule without kind",
        replace('schedule = { kind = "uniform" }', "schedule = { a = 1 }"),
        "arms[0].schedule",
    ),
    ("duplicate arms", replace('name = "taper"', 'name = "uniform"'), "arms[1].name"),
    ("bad arm name", replace('name = "taper"', 'name = "a/b"'), "arms[1].name"),
    ("heads do not divide", replace("n_heads = 4", "n_heads = 5"), "model.n_heads"),
    (
        "kv heads do not divide heads",
        replace("n_heads = 4", "n_heads = 4\nn_kv_heads = 3"),
        "model.n_kv_heads: 3 does not divide n_heads 4",
    ),
    ("width not multiple", replace("ffn_width = 128", "ffn_width = 120"), "model.ffn_width"),
    ("unknown tokenizer", replace('kind = "bpe"', 'kind = "wordpiece"'), "data.tokenizer"),
    (
        "tokenizer vocab too small",
        replace("vocab_size = 512", "vocab_size = 3"),
        "data.tokenizer.vocab_size",
    ),
    ("duplicate seeds", replace("seeds = [0, 1]", "seeds = [1, 1]"), "train"),
    ("seeds wrong type", replace("seeds = [0, 1]", 'seeds = "0"'), "train.seeds"),
    (
        "measure wrong string",
        replace('name = "t"', 'name = "t"\nmeasure = "everything"'),
        "measure",
    ),
    (
        "unknown geometry",
        replace(
            "[[arms]]",
            '[[measure]]\ngeometry = { kind = "hyperbolc" }\n'
            'statistic = { kind = "shift" }\n\n[[arms]]',
        ),
        "measure[0].geometry",
    ),
    ("both source and files", replace("[data]", '[data]\nsource = "x"\nfiles = ["a.txt"]'), "data"),
    ("missing baseline arm", replace('name = "uniform"', 'name = "flat"'), "report.baseline"),
    ("model is not a table", replace("[model]", "model = 3\n[unused]"), "model"),
    (
        "compare names an unknown arm",
        compare('[["taper", "tapr"]]'),
        "report.compare[0]: no arm is named 'tapr'",
    ),
    (
        "compare an arm with itself",
        compare('[["uniform", "taper"], ["taper", "taper"]]'),
        "report.compare[1]: compares 'taper' with itself",
    ),
    (
        "compare a pair twice",
        compare('[["uniform", "taper"], ["taper", "uniform"]]'),
        "compared already in report.compare[0]",
    ),
    (
        "compare is not a pair",
        compare('[["uniform", "taper", "uniform"]]'),
        "report.compare[0]: Tuple should have at most 2 items",
    ),
]


@pytest.mark.parametrize(
    ("content", "expected"), [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED]
)
def test_malformed_spec_exits_2_with_message(tmp_path: Path, content: bytes, expected: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_bytes(content)
    result = CliRunner().invoke(cli, ["validate", str(path)])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert expected in result.output
    assert str(path) in result.output


def test_corpus_is_large_enough() -> None:
    assert len(MALFORMED) >= 30


def test_valid_base_spec_validates(tmp_path: Path) -> None:
    path = tmp_path / "ok.toml"
    path.write_text(VALID)
    result = CliRunner().invoke(cli, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    assert "is valid" in result.output


def test_missing_file_exits_2(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["validate", str(tmp_path / "nope.toml")])
    assert result.exit_code == 2
    assert "no such file" in result.output


def test_debug_flag_shows_traceback(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_bytes(replace("n_heads = 4", "n_heads = 5"))
    result = CliRunner().invoke(cli, ["--debug", "validate", str(path)])
    assert result.exit_code != 0
    assert result.exception is not None  # re-raised instead of a one-line message


def test_a_probe_only_spec_of_a_checkpoint_needs_no_train_table() -> None:
    from geospec.errors import SpecError
    from geospec.spec.loading import validate_spec
    from geospec.testing import minimal_spec

    pretrained = minimal_spec(
        probe_only=True,
        reference={"checkpoint": "model.gguf"},
        data={"tokenizer": {"kind": "pretrained", "path": "model.gguf"}},
    )
    del pretrained["train"]
    assert validate_spec(pretrained).train.device == "auto"
    trained_here = minimal_spec(probe_only=True)  # its reference is trained with [train]
    del trained_here["train"]
    with pytest.raises(SpecError, match="train: required key is missing"):
        validate_spec(trained_here)
