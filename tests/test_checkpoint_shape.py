"""A pretrained reference's shape fills [model] (from config.json or GGUF metadata), and a value
that contradicts the checkpoint is one line naming both. The truth is the model transformers
builds from the same files (or the gguf library's own reader)."""

from __future__ import annotations

from pathlib import Path

import hf_models
import numpy as np
import pytest
import tomlkit
from click.testing import CliRunner

from geospec.cli import cli
from geospec.spec.checkpoint_shape import read_gguf_header, shape_from_gguf
from geospec.spec.loading import load_spec
from geospec.testing import minimal_spec

pytestmark = pytest.mark.torch


def probe_only_spec(directory: Path, checkpoint: str, **model: object) -> Path:
    spec = minimal_spec(
        probe_only=True,
        reference={"checkpoint": checkpoint},
        data={"tokenizer": {"kind": "pretrained", "path": checkpoint}},
    )
    spec["model"] = {"seq_len": 16, "multiple_of": 8, **model}
    path = directory / "spec.toml"
    path.write_text(tomlkit.dumps(spec))
    return path


def shape_of(model: object) -> dict[str, object]:
    """The shape as the built model's own modules say it (not its config)."""
    import torch

    assert isinstance(model, torch.nn.Module)
    inner = getattr(model, "model", None) or model.transformer  # type: ignore[attr-defined]
    layers = getattr(inner, "layers", None) or inner.h
    embedding = model.get_input_embeddings().weight  # type: ignore[operator]
    head = model.get_output_embeddings().weight  # type: ignore[operator]
    block = layers[0]
    if hasattr(block, "mlp") and hasattr(block.mlp, "up_proj"):
        attention = block.self_attn
        head_dim = attention.head_dim
        ffn = block.mlp.up_proj.out_features
        heads = attention.q_proj.out_features // head_dim
        kv_heads = attention.k_proj.out_features // head_dim
        bias = block.mlp.up_proj.bias is not None
    else:  # GPT-2: Conv1D (in, out)
        ffn = block.mlp.c_fc.weight.shape[1]
        heads = block.attn.num_heads
        kv_heads = heads
        bias = block.mlp.c_fc.bias is not None
    return {
        "n_layers": len(layers),
        "d_model": embedding.shape[1],
        "vocab_size": embedding.shape[0],
        "ffn_width": ffn,
        "n_heads": heads,
        "n_kv_heads": kv_heads,
        "tie_embeddings": head.data_ptr() == embedding.data_ptr(),
        "bias": bias,
    }


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma2", "gemma3", "mistral", "qwen2"])
def test_model_is_filled_from_the_checkpoint_config(tmp_path: Path, family: str) -> None:
    model = getattr(hf_models, family)()
    model.save_pretrained(tmp_path / "model")
    spec = load_spec(probe_only_spec(tmp_path, "model"))
    filled = spec.model.model_dump()
    truth = shape_of(model)
    filled["n_kv_heads"] = filled["n_kv_heads"] or filled["n_heads"]
    assert {key: filled[key] for key in truth} == truth
    assert spec.model.activation == ("gelu" if family == "gpt2" else "swiglu")
    assert (spec.model.seq_len, spec.model.multiple_of) == (16, 8)  # the spec's own


def test_a_value_contradicting_the_checkpoint_names_both(tmp_path: Path) -> None:
    hf_models.llama().save_pretrained(tmp_path / "model")
    path = probe_only_spec(tmp_path, "model", n_layers=16, ffn_width=80)  # 3 layers, 80 wide
    result = CliRunner().invoke(cli, ["validate", str(path)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "model.n_layers: 16 contradicts the checkpoint" in result.output
    assert "says 3 (num_hidden_layers)" in result.output
    assert "ffn_width" not in result.output  # the value that agrees is fine
    # A spec that trains arms from the checkpoint's profiles may name its own target.
    data = tomlkit.parse(path.read_text())
    data["probe_only"] = False
    path.write_text(tomlkit.dumps(data))
    assert load_spec(path).model.n_layers == 16


def test_a_placeholder_path_fails_validate_naming_the_field(tmp_path: Path) -> None:
    path = probe_only_spec(tmp_path, "/path/to/Llama-3.2-1B")
    result = CliRunner().invoke(cli, ["validate", str(path)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "reference.checkpoint: /path/to/Llama-3.2-1B does not exist" in result.output
    assert "required key is missing" not in result.output


def write_gguf(path: Path, *, tied: bool) -> None:
    gguf = pytest.importorskip("gguf")
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(5)
    writer.add_embedding_length(64)
    writer.add_head_count(8)
    writer.add_head_count_kv(2)
    writer.add_feed_forward_length(176)
    writer.add_rope_freq_base(500000.0)
    writer.add_context_length(128)
    writer.add_token_list([f"t{i}" for i in range(300)])
    writer.add_tensor("token_embd.weight", np.zeros((300, 64), dtype=np.float32))
    if not tied:
        writer.add_tensor("output.weight", np.zeros((300, 64), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("tied", [True, False])
def test_gguf_metadata_read_without_numpy_agrees_with_the_gguf_library(
    tmp_path: Path, tied: bool
) -> None:
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "m.gguf"
    write_gguf(path, tied=tied)
    metadata, tensors = read_gguf_header(path)
    reader = gguf.GGUFReader(str(path))
    assert tensors == {tensor.name for tensor in reader.tensors}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        value = field.contents()
        expected = len(value) if key == "tokenizer.ggml.tokens" else value
        assert metadata[key] == pytest.approx(expected), key
    shape = shape_from_gguf(path)
    assert shape is not None
    assert shape.values | {"rope_theta": 0} == {
        "n_layers": 5, "d_model": 64, "n_heads": 8, "n_kv_heads": 2, "ffn_width": 176,
        "activation": "swiglu", "vocab_size": 300, "norm": "rmsnorm", "positions": "rope",
        "rope_theta": 0, "tie_embeddings": tied, "bias": False,
    }  # fmt: skip
    assert shape.values["rope_theta"] == 500000.0
    spec = load_spec(probe_only_spec(tmp_path, "m.gguf"))
    assert (spec.model.n_layers, spec.model.tie_embeddings) == (5, tied)


def test_not_a_gguf_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "m.gguf").write_bytes(b"nope" * 10)
    result = CliRunner().invoke(cli, ["validate", str(probe_only_spec(tmp_path, "m.gguf"))])
    assert result.exit_code == 2 and "Traceback" not in result.output
    # a damaged file cannot be loaded either: giving [model] would not help
    assert (
        f"reference.checkpoint: {tmp_path / 'm.gguf'} is not a readable GGUF file" in result.output
    )
    assert "GGUF magic" in result.output and "give [model] in full" not in result.output
