"""Probe-only specs say exactly which text they probe: .txt files whole or cut at a separator,
no end-of-text token between documents, the whole text as validation split, and a diagnose loss
that scores only real text."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tomlkit
from click.testing import CliRunner

from geospec.cli import cli
from geospec.engine.corpus import Corpus
from geospec.engine.token_data import prepare_data
from geospec.engine.tokenizer import gpt2_tokenizer
from geospec.measure.sensitivity import scored_text
from geospec.spec.sections import DataSpec
from geospec.testing import minimal_spec

TEXT = "First part.\n\nStill first.\n---\nSecond part.\n---\n\n---\nThird.\n"


def documents(tmp_path: Path, **options: object) -> list[str]:
    path = tmp_path / "text.txt"
    path.write_text(TEXT)
    data = DataSpec.model_validate({"files": [str(path)], **options})
    return [doc for batch in Corpus(data).batches() for doc in batch]


def test_txt_files_whole_or_at_a_separator(tmp_path: Path) -> None:
    assert documents(tmp_path) == [p for p in TEXT.split("\n\n") if p.strip()]
    assert documents(tmp_path, txt_documents="file") == [TEXT]
    by_separator = documents(tmp_path, txt_documents="separator", txt_separator="\n---\n")
    assert by_separator == [p for p in TEXT.split("\n---\n") if p.strip()]
    with pytest.raises(ValueError, match="txt_separator goes with"):
        DataSpec(txt_documents="separator")
    with pytest.raises(ValueError, match="txt_separator goes with"):
        DataSpec(txt_separator="x")


def test_defaults_leave_keys_alone() -> None:
    assert (
        DataSpec().key_form() == DataSpec(end_of_text=True, txt_documents="paragraphs").key_form()
    )
    assert "end_of_text" not in DataSpec().key_form()
    assert DataSpec(end_of_text=False).key_form() != DataSpec().key_form()


@pytest.mark.torch
def test_no_end_of_text_and_the_whole_text_as_validation(tmp_path: Path) -> None:
    """val_fraction = 1.0 puts every document into the validation split (no train split), and
    end_of_text = false packs the documents' tokens with nothing between them."""
    path = tmp_path / "text.txt"
    path.write_text(TEXT)
    data = DataSpec.model_validate(
        {
            "files": [str(path)],
            "txt_documents": "separator",
            "txt_separator": "\n---\n",
            "end_of_text": False,
            "val_fraction": 1.0,
            "tokenizer": {"kind": "gpt2"},
        }
    )
    tokens = prepare_data(data, tmp_path / "cache")
    assert len(tokens.train) == 0
    reference = gpt2_tokenizer()
    expected = [i for d in documents(tmp_path, txt_documents="separator", txt_separator="\n---\n")
                for i in reference.encode(d, add_special_tokens=False).ids]  # fmt: skip
    assert list(tokens.val) == expected
    assert tokens.eot_id not in set(tokens.val.tolist())


def test_val_fraction_above_half_only_when_nothing_is_trained(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    spec = minimal_spec(data={"tokenizer": {"kind": "bpe", "vocab_size": 512}, "val_fraction": 1.0})
    path.write_text(tomlkit.dumps(spec))
    result = CliRunner().invoke(cli, ["validate", str(path)])
    assert result.exit_code == 2 and "data.val_fraction" in result.output
    spec["probe_only"] = True
    (tmp_path / "model-dir").mkdir()  # validate checks that a local checkpoint exists
    spec["reference"] = {"checkpoint": "model-dir"}
    spec["data"]["tokenizer"] = {"kind": "pretrained", "path": "model-dir"}
    path.write_text(tomlkit.dumps(spec))
    result = CliRunner().invoke(cli, ["validate", str(path)])
    assert result.exit_code == 0, result.output


def test_diagnose_scores_no_target_after_the_last_document() -> None:
    eot = 7
    packed = np.array([1, 2, 7, 3, 4, 5, 7])  # two documents, each followed by eot
    assert scored_text(packed, eot).tolist() == [1, 2, 7, 3, 4, 5]  # the inner one separates
    assert scored_text(packed[:-1], None).tolist() == [1, 2, 7, 3, 4, 5]
    assert scored_text(np.array([1, 2, 3]), eot).tolist() == [1, 2, 3]
