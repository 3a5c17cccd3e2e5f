"""A re-fit with its intercept (or mean compensation) adds a bias to the FFN output projection,
which Qwen2's and Gemma 3's transformers MLP is built without. Every export geospec writes from
such a unit carries it: the true-width directory (load_pruned gives the projection its bias),
and on a family written as llama.cpp's deci (Qwen2) the GGUF file's ffn_down.bias, in the
source's own type, for every path that writes one (What to ship, select.shipped, --export
ARM@KEEP --format gguf, geospec export). Only the padded checkpoint, which plain transformers
reads and would drop the bias, is refused: before anything runs where the arm is named (exit 2,
the spec file, the option and the fix), warned about where it is the recommended arm. Tiny
checkpoints of each family are built here with transformers."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import hf_models
import numpy as np
import pytest
import tomlkit
import torch
from click.testing import CliRunner, Result
from test_prune import word_corpus

import geospec
from geospec.cli import cli

pytestmark = [pytest.mark.torch]

#: Each family's builder and its config.json model_type (what validate reads).
FAMILIES: dict[str, tuple[Callable[[], object], str]] = {
    "qwen2": (hf_models.qwen2, "qwen2"),
    "gemma3": (hf_models.gemma3, "gemma3_text"),
    "llama": (lambda: hf_models.llama(intermediate_size=64), "llama"),
}
ARMS = [
    {"name": "uniform", "schedule": {"kind": "uniform"}},
    {"name": "refit", "schedule": {"kind": "uniform"}, "repair": "lstsq"},
]


def family_spec(directory: Path, family: str, **prune: object) -> Path:
    """A prune spec of a tiny checkpoint of ``family`` (its shape read from its config.json)
    with a plain arm and a re-fit with its intercept (the default)."""
    build, _ = FAMILIES[family]
    if not (directory / "model").exists():
        hf_models.save_with_words(build(), directory / "model")  # type: ignore[arg-type]
    word_corpus(directory / "docs.jsonl", 0)
    spec = {
        "name": family,
        "out": str(directory / "run"),
        "model": {"seq_len": 16, "multiple_of": 8},
        "data": {"files": ["docs.jsonl"], "tokenizer": {"kind": "pretrained", "path": "model"}},
        "reference": {"checkpoint": "model"},
        "probe": {"tokens": 64},
        "prune": {"keep": 0.5, "calibration": {"windows": 4, "seeds": [0]},
                  "eval": {"corpora": ["docs.jsonl"], "windows": 2}, "arms": ARMS} | prune,
    }  # fmt: skip
    path = directory / "spec.toml"
    path.write_text(tomlkit.dumps(spec))
    return path


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


@pytest.mark.parametrize("family", ["qwen2", "gemma3", "llama"])
def test_a_refit_with_an_intercept_exported_at_true_widths_is_valid_and_not_warned_about(
    tmp_path: Path, family: str
) -> None:
    """Exported in the spec (the true-width directory), recommended by What to ship and
    exported as best@KEEP: nothing is refused or warned about, on any family."""
    spec = family_spec(tmp_path, family, export=["best@0.5", "refit@0.5"], select={"windows": 2})
    result = run("validate", str(spec))
    assert result.exit_code == 0, result.output
    assert "warning:" not in result.output
    started = run("run", str(spec), "--until", "reference")
    assert started.exit_code == 0 and "warning:" not in started.output, started.output


@pytest.mark.parametrize("family", ["qwen2", "gemma3"])
def test_a_padded_export_of_a_refit_with_an_intercept_is_refused_before_anything_runs(
    tmp_path: Path, family: str
) -> None:
    """--export ARM@KEEP --padded (prune, before any stage): one line naming the option, the
    file the family was read from and the fixes (the true widths or GGUF, which carry the bias;
    no intercept), exit 2; no run directory is made."""
    spec = family_spec(tmp_path, family, export=False)
    model_type = FAMILIES[family][1]
    out = tmp_path / "out"
    result = run("prune", str(spec), "--export", "refit@0.5", "--to", str(out), "--padded")
    assert result.exit_code == 2 and "Traceback" not in result.output
    said = " ".join(result.output.split())
    assert f"config.json of {tmp_path / 'model'}" in said
    assert "--export refit@0.5 --padded: refit's repair ('lstsq') adds a bias" in said
    assert f"{model_type} MLP has no bias" in said and "leave --padded out" in said
    assert "lstsq = { intercept = false }" in said
    assert not (tmp_path / "run").exists() and not out.exists()


def test_a_recommended_refit_is_shipped_and_exported_with_its_bias(tmp_path: Path) -> None:
    """Both arms re-fitted with their intercept on a Qwen2, so the recommendation is one of
    them: nothing is warned about; What to ship measures its files; --export best@KEEP writes
    its true-width directory, whose down projections hold the bias and whose loss is the one
    the prune recorded. --export best@KEEP --padded is warned about at the start and refused
    (exit 2, one line) once the prune has chosen, its units reused; geospec export --padded of
    the finished unit is refused in one line too."""
    from test_qwen2 import eval_loss_here, prune_spec  # a tiny Qwen2 with a BPE tokenizer

    arms = [ARMS[1], {**ARMS[1], "name": "refit-ends", "schedule": {"kind": "protect", "first": 1}}]
    spec = prune_spec(tmp_path, arms=arms, baseline="refit", export=False,
                      select={"windows": 2, "runtime": False})  # fmt: skip
    result = run("prune", str(spec), "--export", "best@0.5", "--to", str(tmp_path / "best"))
    assert result.exit_code == 0, result.output + repr(result.exception)
    assert "warning:" not in result.output
    record = json.loads((tmp_path / "run" / "prune.json").read_text())
    budget = record["budgets"][0]
    chosen = budget["recommended"]["arm"]
    assert "unexportable" not in budget["recommended"]["shipped"]
    assert budget["recommended"]["shipped"]["safetensors_bytes"] > 0
    model = geospec.load_pruned(tmp_path / "best")
    assert all(layer.mlp.down_proj.bias is not None for layer in model.model.layers)
    loss = eval_loss_here(tmp_path, model)
    assert loss == pytest.approx(budget["arms"][chosen]["loss"]["docs.jsonl"]["0"], rel=1e-5)
    out = tmp_path / "padded"
    result = run("prune", str(spec), "--export", "best@0.5", "--to", str(out), "--padded")
    assert result.exit_code == 2 and "Traceback" not in result.output
    said = " ".join(result.output.split())
    assert said.startswith("warning: prune.select: if the recommended arm is refit or refit-ends")
    assert "--export best@0.5 --padded fails" in said.split("✓")[0]
    assert f"--export {chosen}@0.5 --padded: {chosen}'s repair ('lstsq') adds a bias" in said
    assert "pruned models" not in said  # the units were reused, none computed again
    assert not out.exists()
    unit = tmp_path / "run" / "prune" / "keep-0.5" / chosen / "seed-0"
    result = run("export", str(unit), "--to", str(out), "--padded")  # the finished unit
    assert result.exit_code == 2 and "Traceback" not in result.output
    said = " ".join(result.output.split())
    assert "a padded export (--padded)" in said and "qwen2 MLP has no bias" in said
    assert "leave --padded out" in said and not out.exists()


@pytest.mark.gguf
def test_a_qwen2_gguf_refit_is_shipped_and_exported_as_deci_with_its_down_bias(
    tmp_path: Path,
) -> None:
    """A Qwen2 GGUF reference (Q8_0, which gguf-py writes) with a re-fit that has its intercept
    and select.shipped: validate accepts it; every unit's GGUF file is written and scored, and
    the recommendation made on them; What to ship measures the recommended file. geospec export
    and --export ARM@KEEP --format gguf write the re-fit's file in the source's Q8_0 with each
    down projection's bias (f32, equal to the exported model's), and llama.cpp's deci graph on
    it gives the logits of the model geospec scores as shipped (the file de-quantized)."""
    gguf = pytest.importorskip("gguf")
    import gguf_models
    from test_qwen2 import deci_logits, ids, prune_spec, qwen2

    from geospec.prune.gguf_weights import shipped_model

    gguf_models.bpe_tokenizer(tmp_path / "tokenizer")
    gguf_models.qwen2_gguf(tmp_path / "q.gguf", qwen2(vocab=gguf_models.VOCAB),
                           tmp_path / "tokenizer", q8_0=True)  # fmt: skip
    spec = prune_spec(tmp_path, arms=ARMS, export=False, select={"windows": 2, "shipped": True})
    data = tomlkit.parse(spec.read_text())
    data["reference"]["checkpoint"] = "q.gguf"  # type: ignore[index]
    data["prune"]["select"]["runtime"] = False  # type: ignore[index]
    spec.write_text(tomlkit.dumps(data))
    result = run("validate", str(spec))
    assert result.exit_code == 0 and "warning:" not in result.output, result.output
    out = tmp_path / "refit.gguf"
    result = run("prune", str(spec), "--export", "refit@0.5", "--format", "gguf", "--to", str(out))
    assert result.exit_code == 0, result.output + repr(result.exception)
    budget = json.loads((tmp_path / "run" / "prune.json").read_text())["budgets"][0]
    assert budget["recommended"]["on"] == "shipped"
    for arm in budget["arms"].values():  # each unit's file scored on every selection window
        assert len(arm["shipped_select_loss"]["0"]) == 2
        assert all(np.isfinite(arm["shipped_select_loss"]["0"]))
    shipped = budget["recommended"]["shipped"]
    assert shipped["gguf"]["type"] == "Q8_0" and shipped["gguf"]["bytes"] > 0
    assert "skipped" not in shipped["score"]
    unit = tmp_path / "run" / "prune" / "keep-0.5" / "refit" / "seed-0"
    again = tmp_path / "exported.gguf"
    result = run("export", str(unit), "--to", str(again), "--format", "gguf")
    assert result.exit_code == 0, result.output + repr(result.exception)
    model = geospec.load_pruned(unit / "model")
    tensors = {t.name: t for t in gguf.GGUFReader(str(out)).tensors}
    exported = {t.name: t for t in gguf.GGUFReader(str(again)).tensors}
    assert set(exported) == set(tensors)  # one path: the same tensors (the name differs)
    for name, tensor in tensors.items():
        assert exported[name].tensor_type == tensor.tensor_type
        np.testing.assert_array_equal(exported[name].data, tensor.data)
    assert tensors["blk.0.ffn_down.weight"].tensor_type == gguf.GGMLQuantizationType.Q8_0
    for i, layer in enumerate(model.model.layers):
        stored = tensors[f"blk.{i}.ffn_down.bias"]
        assert stored.tensor_type == gguf.GGMLQuantizationType.F32
        bias = layer.mlp.down_proj.bias.detach().numpy()
        assert np.abs(bias).max() > 0  # every layer is cut and re-fitted
        np.testing.assert_array_equal(stored.data, bias)
    tokens = [int(i) for i in ids(gguf_models.VOCAB)[0]]
    with torch.no_grad():
        scored = shipped_model(unit / "model", out)(input_ids=torch.tensor([tokens])).logits
    np.testing.assert_allclose(deci_logits(out, tokens), scored[0].double().numpy(), atol=2e-4,
                               rtol=1e-4)  # fmt: skip


@pytest.mark.gguf
def test_select_shipped_on_a_gguf_the_writer_does_not_map_is_one_line(tmp_path: Path) -> None:
    """select.shipped writes every arm's GGUF file, repaired or not: a Gemma 3 GGUF reference
    (its architecture read from the header; the GGUF writer maps only deci's families, and
    llama.cpp's gemma3 loader reads no FFN bias) has none, so validate refuses it in one line
    naming the file, the field and the fix, which then validates."""
    gguf = pytest.importorskip("gguf")
    writer = gguf.GGUFWriter(str(tmp_path / "g.gguf"), "gemma3")
    writer.add_block_count(2)
    writer.add_context_length(64)
    writer.add_embedding_length(32)
    writer.add_feed_forward_length(64)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_file_type(int(gguf.LlamaFileType.MOSTLY_Q8_0))
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"t{i}" for i in range(64)])
    writer.add_tensor("token_embd.weight", np.zeros((64, 32), np.float32))
    writer.add_tensor("output_norm.weight", np.zeros(32, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    arms = [ARMS[0], {"name": "cosine", "schedule": {"kind": "cosine"}}]
    spec = family_spec(tmp_path, "llama", arms=arms, select={"windows": 2, "shipped": True})
    data = tomlkit.parse(spec.read_text())
    data["reference"]["checkpoint"] = "g.gguf"  # type: ignore[index]
    del data["data"]["tokenizer"]  # type: ignore[attr-defined]
    spec.write_text(tomlkit.dumps(data))
    result = run("validate", str(spec))
    assert result.exit_code == 2 and "Traceback" not in result.output
    said = " ".join(result.output.split())
    assert str(spec) in said and "prune.select.shipped: every arm's GGUF file" in said
    assert "maps llama, mistral, qwen2 (llama.cpp's deci), not gemma3" in said
    assert f"GGUF metadata of {tmp_path / 'g.gguf'}" in said and "select.shipped = false" in said
    assert run("validate", str(spec), "--set", "prune.select.shipped=false").exit_code == 0
