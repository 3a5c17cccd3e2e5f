"""A downloaded checkpoint is data, not code: geospec never runs a checkpoint's own Python unless
the spec says so, and every failure to load one is one line naming the path."""

from __future__ import annotations

import json
from pathlib import Path

import hf_models
import pytest

from geospec.engine.pretrained import load_pretrained
from geospec.engine.tokenizer import pretrained_tokenizer
from geospec.errors import UsageError

pytestmark = pytest.mark.torch

EVIL = """
from pathlib import Path
Path(MARKER).write_text("the checkpoint code ran")
from transformers import LlamaForCausalLM
class EvilModel(LlamaForCausalLM):
    pass
"""


@pytest.fixture
def checkpoint_with_code(tmp_path: Path) -> Path:
    directory = tmp_path / "evil"
    hf_models.llama().save_pretrained(directory)
    config = json.loads((directory / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.EvilModel"}
    (directory / "config.json").write_text(json.dumps(config))
    (directory / "modeling_evil.py").write_text(
        EVIL.replace("MARKER", repr(str(directory / "code-ran")))
    )
    return directory


def test_a_checkpoint_with_its_own_code_loads_without_running_it(
    checkpoint_with_code: Path,
) -> None:
    """Its architecture is one transformers knows: the checkpoint's own class is ignored."""
    model = load_pretrained(checkpoint_with_code)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert not (checkpoint_with_code / "code-ran").exists()


def test_a_checkpoint_that_needs_its_own_code_is_refused_without_running_it(
    checkpoint_with_code: Path,
) -> None:
    config = json.loads((checkpoint_with_code / "config.json").read_text())
    config["model_type"] = "evil-llama"  # an architecture only its own code can build
    config["auto_map"]["AutoConfig"] = "modeling_evil.EvilConfig"
    (checkpoint_with_code / "config.json").write_text(json.dumps(config))
    with pytest.raises(UsageError, match="ships its own Python code") as caught:
        load_pretrained(checkpoint_with_code)
    assert str(checkpoint_with_code) in str(caught.value)
    assert "trust_remote_code = true" in str(caught.value)
    assert not (checkpoint_with_code / "code-ran").exists()


def test_trust_remote_code_runs_it_when_the_spec_says_so(checkpoint_with_code: Path) -> None:
    model = load_pretrained(checkpoint_with_code, trust_remote_code=True)
    assert type(model).__name__ == "EvilModel"
    assert (checkpoint_with_code / "code-ran").exists()


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda p: p.write_bytes(p.read_bytes()[:100]), id="truncated"),
        pytest.param(lambda p: p.write_bytes(b"\x00" * 64), id="garbage"),
        pytest.param(lambda p: p.unlink(), id="deleted"),
    ],
)
def test_damaged_weights_are_one_line_naming_the_path(tmp_path: Path, damage: object) -> None:
    directory = tmp_path / "model"
    hf_models.llama().save_pretrained(directory)
    damage(directory / "model.safetensors")  # type: ignore[operator]
    with pytest.raises(UsageError, match=f"cannot load {directory}"):
        load_pretrained(directory)


def test_a_tokenizer_directory_that_is_not_one_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(UsageError, match=f"cannot load a tokenizer from {tmp_path}"):
        pretrained_tokenizer(tmp_path)
