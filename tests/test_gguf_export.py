"""The GGUF writer (geospec.prune.gguf_export) read back with gguf-py's own reader: llama.cpp's
deci keys with the per-layer widths, the tensors at those widths, the tokenizer; what it does not
map is one line and no file. llama.cpp itself reads the files in tests/test_llamacpp.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gguf_models
import hf_models
import numpy as np
import pytest
import torch
from click.testing import CliRunner

from geospec.cli import cli
from geospec.errors import UsageError
from geospec.prune.hf_export import export_pruned

pytestmark = [pytest.mark.torch, pytest.mark.gguf, pytest.mark.usefixtures("one_torch_thread")]
gguf = pytest.importorskip("gguf", reason="the gguf extra: pip install 'geospec[gguf]'")

from geospec.prune.gguf_export import gguf_widths, write_gguf  # noqa: E402


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("tokenizer")
    gguf_models.bpe_tokenizer(directory)
    return directory


def eos_of(tokenizer_dir: Path) -> int:
    return int(json.loads((tokenizer_dir / "tokenizer.json").read_text())["added_tokens"][0]["id"])


def fields(path: Path) -> dict[str, object]:
    reader = gguf.GGUFReader(str(path))
    return {key: field.contents() for key, field in reader.fields.items()}


def test_the_file_holds_deci_keys_per_layer_widths_and_true_shapes(
    tokenizer_dir: Path, tmp_path: Path
) -> None:
    model = gguf_models.llama(eos_of(tokenizer_dir))
    written = write_gguf(model, tmp_path / "m.gguf", "f32", tokenizer=tokenizer_dir)
    values = fields(written.path)
    assert values["general.architecture"] == "deci"
    assert values["deci.feed_forward_length"] == gguf_models.WIDTHS
    assert values["deci.block_count"] == 3 and values["deci.embedding_length"] == 64
    assert values["deci.attention.head_count"] == 4 and values["deci.attention.head_count_kv"] == 2
    assert values["deci.rope.freq_base"] == 500.0 and values["deci.rope.dimension_count"] == 16
    assert values["deci.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-5)
    assert gguf_widths(written.path) == gguf_models.WIDTHS
    reader = gguf.GGUFReader(str(written.path))
    tensors = {t.name: t for t in reader.tensors}
    for layer, width in enumerate(gguf_models.WIDTHS):  # GGUF lists ne: (in, out)
        assert list(tensors[f"blk.{layer}.ffn_gate.weight"].shape) == [64, width]
        assert list(tensors[f"blk.{layer}.ffn_down.weight"].shape) == [width, 64]
        # the FFN's values are transformers' own (unpermuted); the down matrix as it is
        down = model.model.layers[layer].mlp.down_proj.weight.detach().numpy()
        np.testing.assert_array_equal(tensors[f"blk.{layer}.ffn_down.weight"].data, down)
    assert written.parameters == sum(p.numel() for p in model.parameters())
    assert written.parameters == sum(int(t.n_elements) for t in reader.tensors)
    # the query rows are permuted per head into llama.cpp's interleaved rope pairs: row j of
    # head h's half k goes to row 2 j + k (head size 16)
    q = model.model.layers[0].self_attn.q_proj.weight.detach().numpy()
    stored = tensors["blk.0.attn_q.weight"].data
    for head in range(4):
        for k in range(2):
            for j in range(8):
                np.testing.assert_array_equal(
                    stored[16 * head + 2 * j + k], q[16 * head + 8 * k + j]
                )
    # the tokenizer: llama.cpp's gpt2 BPE with GPT-2's pre-tokenizer, every token and merge
    vocab = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    tokens = values["tokenizer.ggml.tokens"]
    assert values["tokenizer.ggml.model"] == "gpt2" and values["tokenizer.ggml.pre"] == "gpt-2"
    assert isinstance(tokens, list) and len(tokens) == gguf_models.VOCAB
    assert all(tokens[i] == t for t, i in vocab["model"]["vocab"].items())
    merges = values["tokenizer.ggml.merges"]
    assert isinstance(merges, list) and len(merges) == len(vocab["model"]["merges"])
    assert values["tokenizer.ggml.eos_token_id"] == eos_of(tokenizer_dir)
    assert "output.weight" in tensors  # untied


def test_a_tied_model_reuses_the_embedding_and_q8_0_quantises_matrices(
    tokenizer_dir: Path, tmp_path: Path
) -> None:
    model = gguf_models.llama(eos_of(tokenizer_dir), tied=True)
    path = write_gguf(model, tmp_path / "q.gguf", "q8_0", tokenizer=tokenizer_dir).path
    reader = gguf.GGUFReader(str(path))
    tensors = {t.name: t for t in reader.tensors}
    assert "output.weight" not in tensors
    kind = gguf.GGMLQuantizationType
    assert tensors["blk.1.ffn_up.weight"].tensor_type == kind.Q8_0
    assert tensors["blk.1.ffn_norm.weight"].tensor_type == kind.F32
    # Q8_0 keeps each block of 32 to 1/127 of its largest value (gguf-py's own dequantiser)
    up = model.model.layers[1].mlp.up_proj.weight.detach().numpy()
    back = gguf.quants.dequantize(tensors["blk.1.ffn_up.weight"].data, kind.Q8_0)
    blocks = np.abs(up).reshape(-1, 32).max(axis=1).repeat(32).reshape(up.shape)
    assert (np.abs(back - up) <= blocks / 127 + 1e-7).all()
    f16 = write_gguf(model, tmp_path / "h.gguf", "f16", tokenizer=tokenizer_dir).path
    half = {t.name: t for t in gguf.GGUFReader(str(f16)).tensors}
    assert half["blk.1.ffn_up.weight"].tensor_type == kind.F16
    np.testing.assert_array_equal(half["blk.1.ffn_up.weight"].data, up.astype(np.float16))


def test_a_true_width_export_directory_is_written_with_its_own_tokenizer(
    tokenizer_dir: Path, tmp_path: Path
) -> None:
    """write_gguf(directory) reads the export with load_pruned; a padded export gives the same
    file's widths (its zero units are dropped)."""
    import shutil

    from geospec.measure.probe import find_ffn_sites
    from geospec.measure.sensitivity import logits_of
    from geospec.prune.cut import pruned

    eos = eos_of(tokenizer_dir)
    model = gguf_models.llama(eos, widths=None)
    ids = torch.tensor([[1, 2, 3, 4]])
    sites = find_ffn_sites(model, 64, lambda: logits_of(model, ids))
    with torch.no_grad(), pruned(sites, [list(range(96))[::-1]] * 3, gguf_models.WIDTHS):
        export_pruned(model, sites, gguf_models.WIDTHS, tmp_path / "true")
        export_pruned(model, sites, gguf_models.WIDTHS, tmp_path / "padded", padded=True)
    for name in ("true", "padded"):
        for file in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(tokenizer_dir / file, tmp_path / name / file)
        written = write_gguf(tmp_path / name, tmp_path / f"{name}.gguf", "f32", name="m")
        assert written.widths == gguf_models.WIDTHS
    assert (tmp_path / "true.gguf").read_bytes() == (tmp_path / "padded.gguf").read_bytes()


def test_what_the_writer_does_not_map_is_one_line_and_no_file(
    tokenizer_dir: Path, tmp_path: Path
) -> None:
    import transformers as hf

    cases = [
        (hf_models.gpt2(), "family 'gpt2' is not mapped"),
        (hf.Qwen2ForCausalLM(hf.Qwen2Config(**_tiny(), use_sliding_window=True)), "sliding"),
        (hf.LlamaForCausalLM(hf.LlamaConfig(**_tiny(), attention_bias=True, head_dim=4)), "query"),
    ]
    for model, words in cases:
        with pytest.raises(UsageError) as caught:
            write_gguf(model, tmp_path / "x.gguf", "f16", tokenizer=tokenizer_dir)
        message = str(caught.value)
        assert words in message and "--format hf" in message and "\n" not in message
    words = tmp_path / "words"
    hf_models.save_with_words(hf_models.llama(), words)  # a word-level tokenizer
    with pytest.raises(UsageError, match=r"tokenizer\.json: not a byte-level BPE"):
        write_gguf(hf_models.llama(), tmp_path / "x.gguf", "f16", tokenizer=words)
    with pytest.raises(UsageError, match="writes f32, f16, q8_0"):
        write_gguf(hf_models.llama(), tmp_path / "x.gguf", "q4_k", tokenizer=words)
    assert list(tmp_path.iterdir()) == [words]  # nothing half-written


def _tiny() -> dict[str, int]:
    return {"vocab_size": 400, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4}  # fmt: skip


def test_a_file_whose_widths_disagree_with_its_tensors_is_refused(
    tokenizer_dir: Path, tmp_path: Path
) -> None:
    """A hand-made deci file whose feed_forward_length lies about layer 1."""
    writer = gguf.GGUFWriter(str(tmp_path / "bad.gguf"), "deci")
    writer.add_feed_forward_length([8, 16])
    for layer, width in enumerate([8, 24]):
        writer.add_tensor(f"blk.{layer}.ffn_gate.weight", np.zeros((width, 4), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(UsageError) as caught:
        gguf_widths(tmp_path / "bad.gguf")
    assert "layer 1 width 16" in str(caught.value) and "[4, 24]" in str(caught.value)
    assert "disagree" in str(caught.value) and str(tmp_path / "bad.gguf") in str(caught.value)


def hand_made_prune_unit(root: Path, tokenizer_dir: Path) -> Path:
    """A run directory as the prune stage leaves it (one unit exported at its true widths), its
    reference checkpoint a directory holding the BPE tokenizer, named relative to the spec."""
    import shutil

    from geospec.measure.probe import find_ffn_sites
    from geospec.measure.sensitivity import logits_of
    from geospec.prune.cut import pruned

    checkpoint = root / "checkpoint"
    shutil.copytree(tokenizer_dir, checkpoint)
    model = gguf_models.llama(eos_of(tokenizer_dir), widths=None)
    model.save_pretrained(checkpoint)
    run = root / "run"
    unit = run / "prune" / "keep-0.667" / "flap" / "seed-0"
    unit.mkdir(parents=True)
    ids = torch.tensor([[1, 2, 3, 4]])
    sites = find_ffn_sites(model, 64, lambda: logits_of(model, ids))
    with torch.no_grad(), pruned(sites, [list(range(96))] * 3, gguf_models.WIDTHS):
        export_pruned(model, sites, gguf_models.WIDTHS, unit / "model")
    (unit / "result.json").write_text(json.dumps({"widths": gguf_models.WIDTHS, "loss": {}}))
    (run / "spec.resolved.toml").write_text('[reference]\ncheckpoint = "checkpoint"\n')
    (run / "run.json").write_text(json.dumps({"spec": str(root / "spec.toml")}))
    return unit


def test_geospec_export_writes_a_prune_unit_as_gguf_with_its_reference_tokenizer(
    tokenizer_dir: Path, tmp_path: Path
) -> None:
    unit = hand_made_prune_unit(tmp_path, tokenizer_dir)
    out = tmp_path / "flap.gguf"
    args = ["export", str(unit), "--to", str(out), "--format", "gguf", "--dtype", "f32"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "FFN widths 32 96 64" in result.output and str(out) in result.output
    assert gguf_widths(out) == gguf_models.WIDTHS
    assert fields(out)["tokenizer.ggml.pre"] == "gpt-2"
    again = CliRunner().invoke(cli, args)  # the file exists now
    assert again.exit_code == 2 and "already exists" in again.output
    no_suffix = CliRunner().invoke(cli, [*args[:3], str(tmp_path / "flap"), *args[4:]])
    assert no_suffix.exit_code == 2 and "ends in .gguf" in no_suffix.output


def without_llama_cpp(monkeypatch: pytest.MonkeyPatch) -> None:
    """llama-cpp-python made absent for this test: ``import llama_cpp`` raises ImportError (a
    None in sys.modules is Python's own way to block a module), so the writer takes the path a
    machine without it takes."""
    import sys

    monkeypatch.setitem(sys.modules, "llama_cpp", None)


def gguf_layout(model: torch.nn.Module) -> dict[str, np.ndarray]:
    """Every matrix of the tiny Llama under its GGUF name as llama.cpp's converter lays it out
    (the query and key rows permuted per head from rotate-half to interleaved pairs), computed
    here from the model, not by the writer."""
    inner: Any = model.model  # type: ignore[union-attr]

    def plain(module: torch.nn.Module) -> np.ndarray:
        return module.weight.detach().numpy()  # type: ignore[operator]

    def pairs(module: torch.nn.Module, heads: int) -> np.ndarray:
        rows, cols = plain(module).shape
        split = plain(module).reshape(heads, 2, rows // heads // 2, cols)
        return split.swapaxes(1, 2).reshape(rows, cols)

    out = {"token_embd.weight": plain(inner.embed_tokens)}
    head = model.get_output_embeddings()  # type: ignore[operator]
    if head.weight.data_ptr() != inner.embed_tokens.weight.data_ptr():
        out["output.weight"] = plain(head)
    for i, layer in enumerate(inner.layers):
        attn, mlp = layer.self_attn, layer.mlp
        out |= {
            f"blk.{i}.attn_q.weight": pairs(attn.q_proj, 4),
            f"blk.{i}.attn_k.weight": pairs(attn.k_proj, 2),
            f"blk.{i}.attn_v.weight": plain(attn.v_proj),
            f"blk.{i}.attn_output.weight": plain(attn.o_proj),
            f"blk.{i}.ffn_gate.weight": plain(mlp.gate_proj),
            f"blk.{i}.ffn_up.weight": plain(mlp.up_proj),
            f"blk.{i}.ffn_down.weight": plain(mlp.down_proj),
        }
    return out


#: Widths whose last layer's down projection has rows of 40: not a multiple of 32.
ODD_WIDTHS = [32, 96, 40]


@pytest.mark.parametrize(("dtype", "tied"), [("q8_0", False), ("q4_1", False), ("q4_1", True)])
def test_without_llama_cpp_gguf_py_quantizes_each_matrix_as_llama_cpp_would(
    tokenizer_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dtype: str, tied: bool
) -> None:
    """The file's matrices, de-quantised by gguf-py, equal the model's own weights quantised and
    de-quantised by gguf-py here: in ``dtype``, the output matrix (the embedding, when tied) in
    Q8_0 as llama.cpp's quantizer keeps it, and the down projection with rows of 40 in f16 (its
    rows do not split into blocks of 32: llama.cpp's fallback); norms f32; a smaller file than
    the f16 one, whose size gguf_size predicts to the byte."""
    from geospec.prune.gguf_size import f16_bytes, gguf_size

    without_llama_cpp(monkeypatch)
    model = gguf_models.llama(eos_of(tokenizer_dir), widths=ODD_WIDTHS, tied=tied)
    written = write_gguf(model, tmp_path / "q.gguf", dtype, tokenizer=tokenizer_dir)
    assert written.quantizer == "gguf-py" and written.dtype == dtype
    kind = gguf.GGMLQuantizationType
    main = kind.Q8_0 if dtype == "q8_0" else kind.Q4_1
    output = "token_embd.weight" if tied else "output.weight"
    stored = {t.name: t for t in gguf.GGUFReader(str(written.path)).tensors}
    expected = gguf_layout(model)
    assert {name for name in stored if name.endswith("norm.weight")} | set(expected) == set(stored)
    for name, weights in expected.items():
        tensor = stored[name]
        if name == "blk.2.ffn_down.weight":
            assert tensor.tensor_type == kind.F16
            np.testing.assert_array_equal(tensor.data, weights.astype(np.float16))
            continue
        wanted = kind.Q8_0 if name == output else main
        assert tensor.tensor_type == wanted, name
        again = gguf.quants.dequantize(gguf.quants.quantize(weights, wanted), wanted)
        np.testing.assert_array_equal(gguf.quants.dequantize(tensor.data, wanted), again)
    assert all(stored[n].tensor_type == kind.F32 for n in stored if n.endswith("norm.weight"))
    values = fields(written.path)
    assert values["general.file_type"] == gguf.LlamaFileType[f"MOSTLY_{dtype.upper()}"]
    f16 = write_gguf(model, tmp_path / "h.gguf", "f16", tokenizer=tokenizer_dir)
    assert written.bytes < f16.bytes and f16_bytes(written.path) == f16.bytes
    assert gguf_size(written.path).f16_bytes == f16.bytes


def source_gguf(path: Path, tokenizer_dir: Path, dtype: str) -> Path:
    """A GGUF file of the unpruned tiny Llama in ``dtype``: a prune's reference checkpoint."""
    model = gguf_models.llama(eos_of(tokenizer_dir), widths=None)
    return write_gguf(model, path, dtype, tokenizer=tokenizer_dir).path


def test_a_units_gguf_export_follows_its_gguf_sources_type_and_says_its_size_against_it(
    tokenizer_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A unit pruned from a Q4_1 GGUF file is exported in Q4_1 when no --dtype is given, and its
    line gives the file's size against the source file's; --dtype chooses another type."""
    from geospec.storage.disk import size

    without_llama_cpp(monkeypatch)
    unit = hand_made_prune_unit(tmp_path, tokenizer_dir)
    source = source_gguf(tmp_path / "source.gguf", tokenizer_dir, "q4_1")
    (unit.parents[3] / "spec.resolved.toml").write_text('[reference]\ncheckpoint = "source.gguf"\n')
    out = tmp_path / "half.gguf"
    result = CliRunner().invoke(cli, ["export", str(unit), "--to", str(out), "--format", "gguf"])
    assert result.exit_code == 0, result.output
    assert fields(out)["general.file_type"] == gguf.LlamaFileType.MOSTLY_Q4_1
    ratio = out.stat().st_size / source.stat().st_size
    assert "GGUF Q4_1 (Q4_1, the source's type; written by gguf-py)" in result.output
    assert f"{ratio:.2f}x the source's {size(source.stat().st_size)} (Q4_1)" in result.output
    assert ratio < 1 and len(result.output.strip().splitlines()) == 1
    chosen = tmp_path / "q8.gguf"
    args = ["export", str(unit), "--to", str(chosen), "--format", "gguf", "--dtype", "Q8_0"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert fields(chosen)["general.file_type"] == gguf.LlamaFileType.MOSTLY_Q8_0
    assert "GGUF Q8_0 (as asked; written by gguf-py)" in result.output


def test_a_k_quant_without_llama_cpp_is_one_line_and_no_file(
    tokenizer_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    without_llama_cpp(monkeypatch)
    unit = hand_made_prune_unit(tmp_path, tokenizer_dir)
    out = tmp_path / "k.gguf"
    args = ["export", str(unit), "--to", str(out), "--format", "gguf", "--dtype", "q4_k_m"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1
    assert "--dtype q4_k_m" in result.output and "pip install llama-cpp-python" in result.output
    assert "q4_1 or q8_0" in result.output and "Traceback" not in result.output
    assert not out.exists() and not list(tmp_path.glob(".k.gguf*"))
    directory = ["export", str(unit), "--to", str(tmp_path / "d"), "--dtype", "f16"]
    hf = CliRunner().invoke(cli, directory)
    assert hf.exit_code == 2 and "--dtype is for --format gguf" in hf.output


def hand_made_gguf(path: Path, file_type: int | None, matrices: list[Any]) -> Path:
    """A GGUF file with only ``general.file_type`` (or none) and zero matrices of these types."""
    writer = gguf.GGUFWriter(str(path), "deci")
    if file_type is not None:
        writer.add_file_type(file_type)
    for i, kind in enumerate(matrices):
        packed = gguf.quants.quantize(np.zeros((4, 256), np.float32), kind)
        writer.add_tensor(f"m{i}.weight", packed, raw_shape=packed.shape, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_sources_type_is_its_file_type_or_its_matrices_and_a_k_quant_needs_llama_cpp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """general.file_type where the file declares it (Q4_K_M), the type most matrices are stored
    in where not; without llama-cpp-python a K-quant source's default is llama.cpp's own
    fallback type for it (Q4_K: Q5_0), said in the reason; a source that is no GGUF file or
    holds a type the writer has not (BF16) gives f16."""
    from geospec.prune.gguf_quant import default_dtype, source_type

    ftype, kind = gguf.LlamaFileType, gguf.GGMLQuantizationType
    k_quant = hand_made_gguf(tmp_path / "k.gguf", ftype.MOSTLY_Q4_K_M, [kind.Q8_0])
    assert source_type(k_quant).label == "Q4_K_M" and source_type(k_quant).dtype == "q4_k_m"
    bare = hand_made_gguf(tmp_path / "bare.gguf", None, [kind.Q4_1, kind.Q4_1, kind.Q8_0])
    assert source_type(bare).dtype == "q4_1"
    bf16 = hand_made_gguf(tmp_path / "bf16.gguf", ftype.MOSTLY_BF16, [])
    assert default_dtype(bf16)[0] == "f16" and "BF16" in default_dtype(bf16)[1]
    assert default_dtype(tmp_path)[0] == "f16" and default_dtype(None)[0] == "f16"
    without_llama_cpp(monkeypatch)
    dtype, why = default_dtype(k_quant)
    assert dtype == "q5_0" and "Q4_K_M" in why and "pip install llama-cpp-python" in why


@pytest.mark.parametrize(
    ("variable", "label"),
    [("GEOSPEC_TEST_GGUF", "Q4_1"), ("GEOSPEC_TEST_GEMMA_GGUF", "Q4_K_M"),
     ("GEOSPEC_TEST_QWEN_GGUF", "Q4_K_M")],
)  # fmt: skip
def test_the_real_gguf_files_types_are_read(variable: str, label: str) -> None:
    """SmolLM2's file is Q4_1, Gemma's and Qwen2.5-Coder's Q4_K_M (nox -s gguf fetches them)."""
    import os

    from geospec.prune.gguf_quant import source_type

    path = os.environ.get(variable)
    if not path:
        pytest.skip(f"{variable} is not set: nox -s gguf fetches the file")
    assert source_type(Path(path)).label == label


def test_a_repaired_cut_writes_its_refitted_down_projections_and_their_bias(
    tokenizer_dir: Path, tmp_path: Path
) -> None:
    """A least-squares repair in memory (prune.repair = "lstsq") goes into deci's GGUF as it
    computes: each layer's ffn_down.weight is the re-fitted kept columns and ffn_down.bias the
    intercept the repair added (llama.cpp reads the optional down bias)."""
    from geospec.measure.probe import find_ffn_sites
    from geospec.measure.sensitivity import logits_of
    from geospec.prune.cut import pruned
    from geospec.prune.repair import calibration_moments, one_pass_refits

    model = gguf_models.llama(eos_of(tokenizer_dir), widths=None)
    ids = torch.randint(0, gguf_models.VOCAB, (8, 24), generator=torch.Generator().manual_seed(0))
    sites = find_ffn_sites(model, gguf_models.WIDTH, lambda: logits_of(model, ids[:1]))
    moments = calibration_moments(model, sites, [(ids[:4], ids[:4]), (ids[4:], ids[4:])])
    orders = [list(range(gguf_models.FULL))[::-1] for _ in sites]
    widths = [32, 64, 48]
    refits = one_pass_refits(sites, moments, orders, widths, damping=0.01)
    with torch.no_grad(), pruned(sites, orders, widths, refits=refits):
        written = write_gguf(model, tmp_path / "m.gguf", "f32", tokenizer=tokenizer_dir)
    tensors = {t.name: t for t in gguf.GGUFReader(str(written.path)).tensors}
    assert gguf_widths(written.path) == widths
    for layer, found in enumerate(refits):
        assert found is not None
        np.testing.assert_array_equal(
            tensors[f"blk.{layer}.ffn_down.weight"].data, found.weight.numpy()
        )
        np.testing.assert_allclose(
            tensors[f"blk.{layer}.ffn_down.bias"].data, found.bias.float().numpy(), rtol=1e-6
        )


def _file_types(path: Path) -> dict[str, Any]:
    """Each tensor's type as the file declares it (gguf-py's reader)."""
    return {t.name: t.tensor_type for t in gguf.GGUFReader(str(path)).tensors}


def _as_stored(weights: np.ndarray, kind: Any) -> np.ndarray:
    """``weights`` as a tensor of ggml type ``kind`` holds them, by gguf-py's own quantizer and
    de-quantizer (a row permutation commutes with it: blocks run along the rows)."""
    types = gguf.GGMLQuantizationType
    if kind == types.F32:
        return weights
    if kind == types.F16:
        return weights.astype(np.float16).astype(np.float32)
    return gguf.quants.dequantize(gguf.quants.quantize(weights, kind), kind).astype(np.float32)


@pytest.mark.parametrize("dtype", ["q8_0", "q4_1"])
def test_a_file_read_back_holds_gguf_pys_own_quantization_of_the_weights(
    tokenizer_dir: Path, tmp_path: Path, dtype: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """load_gguf_weights: every parameter of the model read back from its GGUF file is exactly
    gguf-py's quantization and de-quantization of the original (in the type the file declares
    for it: the tied or output matrix in Q8_0, a down projection whose rows are not whole blocks
    in F16), the query and key rows back in transformers' order; shipped_losses gives the loss
    of the model on its own weights and on those, each equal to a cross-entropy computed here."""
    import copy
    import sys

    import torch.nn.functional as F

    from geospec.measure.probe import find_ffn_sites
    from geospec.measure.sensitivity import logits_of
    from geospec.prune.cut import pruned
    from geospec.prune.gguf_weights import load_gguf_weights, shipped_losses

    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # gguf-py writes the file
    model = gguf_models.llama(eos_of(tokenizer_dir), widths=None)
    ids = torch.tensor([[1, 2, 3, 4]])
    sites = find_ffn_sites(model, 64, lambda: logits_of(model, ids))
    widths = [32, 96, 40]  # 40: rows that are no whole blocks of 32
    with torch.no_grad(), pruned(sites, [list(range(96))] * 3, widths):
        export_pruned(model, sites, widths, tmp_path / "true")
    directory = tmp_path / "true"
    for file in ("tokenizer.json", "tokenizer_config.json"):
        (directory / file).write_bytes((tokenizer_dir / file).read_bytes())
    path = write_gguf(directory, tmp_path / f"{dtype}.gguf", dtype).path
    from geospec.prune.true_width import load_pruned

    original = load_pruned(directory, dtype=torch.float32)
    loaded = copy.deepcopy(original)
    load_gguf_weights(loaded, path)
    declared = _file_types(path)
    by_name = {
        "model.embed_tokens.weight": "token_embd.weight",
        "lm_head.weight": "output.weight",
    }
    kinds = set()
    for name, parameter in original.named_parameters():
        if parameter.ndim == 1:  # norms are stored in f32
            truth = parameter.detach().numpy()
        else:
            layer = name.split(".")[2] if name.startswith("model.layers.") else None
            short = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v",
                     "o_proj": "attn_output", "gate_proj": "ffn_gate", "up_proj": "ffn_up",
                     "down_proj": "ffn_down"}  # fmt: skip
            stored = by_name.get(name) or f"blk.{layer}.{short[name.split('.')[-2]]}.weight"
            kinds.add(declared[stored].name)
            truth = _as_stored(parameter.detach().numpy(), declared[stored])
        got = dict(loaded.named_parameters())[name].detach().numpy()
        np.testing.assert_array_equal(got, truth, err_msg=name)
    assert {"Q8_0", "F16", dtype.upper()} <= kinds  # the rules the file followed were exercised
    tokens = torch.tensor([[5, 9, 14, 3, 27, 8, 2, 11, 30]])
    batches = [(tokens[:, :-1], tokens[:, 1:])]
    losses = shipped_losses(directory, path, batches)

    def cross_entropy(m: Any) -> float:
        with torch.no_grad():
            logits = m(tokens[:, :-1]).logits
        return float(F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()))

    assert losses["float32"] == pytest.approx(cross_entropy(original), abs=1e-6)
    assert losses["shipped"] == pytest.approx(cross_entropy(loaded), abs=1e-6)
    assert losses["windows"] == 1
    assert losses["shipped"] != losses["float32"]


def test_stored_types_count_the_ffn_matrices_that_fell_back(
    tokenizer_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """stored_types: every matrix by the type gguf-py's reader says it has, the FFN ones apart,
    and those whose rows are not whole blocks (the down projection 40 wide, in F16)."""
    import sys
    from collections import Counter

    from geospec.prune.gguf_quant import stored_types

    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    model = gguf_models.llama(eos_of(tokenizer_dir), widths=[32, 96, 40])
    path = write_gguf(model, tmp_path / "m.gguf", "q4_1", tokenizer=tokenizer_dir).path
    tensors = [t for t in gguf.GGUFReader(str(path)).tensors if len(t.shape) == 2]
    found = stored_types(path, "q4_1")
    assert found.matrices == Counter(t.tensor_type.name for t in tensors)
    ffn = [t for t in tensors if ".ffn_" in t.name]
    assert found.ffn == Counter(t.tensor_type.name for t in ffn) and sum(found.ffn.values()) == 9
    assert found.ffn_fallbacks == Counter({"F16": 1})  # blk.2.ffn_down: 40 rows
    assert found.fallbacks == found.ffn_fallbacks  # 64 wide elsewhere: whole blocks of 32


def test_an_exports_fallbacks_are_told_beside_its_sources(
    tokenizer_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model whose rows are not whole blocks falls back in its source file too (Qwen2.5's
    d_model of 896 in Q4_K_M): the export line says how many of its fallbacks the source file
    stores so, counted here from both files by gguf-py's reader; a source of another type is
    not compared."""
    import sys

    from geospec.prune.exports import _gguf_line
    from geospec.prune.gguf_quant import source_stored_types

    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    eos = eos_of(tokenizer_dir)
    source = write_gguf(
        gguf_models.llama(eos, widths=[96, 96, 40]), tmp_path / "source.gguf", "q4_1",
        tokenizer=tokenizer_dir,
    ).path  # fmt: skip
    pruned = write_gguf(
        gguf_models.llama(eos, widths=[40, 72, 40]), tmp_path / "pruned.gguf", "q4_1",
        tokenizer=tokenizer_dir,
    )  # fmt: skip

    def fell(path: Path) -> int:
        return sum(
            1 for t in gguf.GGUFReader(str(path)).tensors if len(t.shape) == 2 and t.shape[0] % 32
        )

    assert (fell(source), fell(pruned.path)) == (1, 3)  # down projections 40 and 72 wide
    in_source = source_stored_types(source, "q4_1")
    assert in_source is not None and sum(in_source.fallbacks.values()) == fell(source)
    line = _gguf_line(pruned, "as asked", source)
    assert f"{fell(pruned.path)} matrices whose rows do not split into blocks of 32" in line
    assert "(the source file stores 1 so: the widths add 2)" in line
    assert source_stored_types(source, "q8_0") is None  # another type: nothing to compare
    assert "the source file stores" not in _gguf_line(pruned, "as asked", None)
