"""The width grid of a prune follows its GGUF export's type (geospec.spec.width_grid): the file's
type read from its header agrees with gguf-py's reading, the grid is that type's block in
gguf-py's own table, a spec that leaves model.multiple_of out gets it, one that sets it keeps its
own, and validate says which grid is in force and why."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tomlkit
from click.testing import CliRunner

from geospec.cli import cli
from geospec.spec.width_grid import export_grid, fill_grid, gguf_file_type

gguf = pytest.importorskip("gguf", reason="the gguf extra: pip install 'geospec[gguf]'")
pytestmark = pytest.mark.gguf


def header_file(path: Path, file_type: int | None, kind: str = "F32") -> Path:
    """A GGUF file of one 2 x 64 matrix in ggml type ``kind``, declaring ``file_type`` (None:
    no ``general.file_type``)."""
    writer = gguf.GGUFWriter(str(path), "llama")
    if file_type is not None:
        writer.add_file_type(file_type)
    weights = np.linspace(-1, 1, 128, dtype=np.float32).reshape(2, 64)
    ggml = gguf.GGMLQuantizationType[kind]
    if ggml == gguf.GGMLQuantizationType.F32:
        writer.add_tensor("blk.0.ffn_down.weight", weights)
    else:
        packed = gguf.quants.quantize(weights, ggml)
        writer.add_tensor("blk.0.ffn_down.weight", packed, raw_shape=packed.shape, raw_dtype=ggml)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


FILE_TYPES = ["MOSTLY_Q4_1", "MOSTLY_Q8_0", "MOSTLY_Q5_0", "MOSTLY_Q4_K_M", "MOSTLY_Q6_K",
              "MOSTLY_Q2_K_S", "MOSTLY_F16", "ALL_F32", "MOSTLY_BF16", "MOSTLY_IQ4_XS"]  # fmt: skip


@pytest.mark.parametrize("name", FILE_TYPES)
def test_a_files_type_and_block_are_gguf_pys(tmp_path: Path, name: str) -> None:
    """general.file_type read from the header is gguf-py's LlamaFileType of it (as a --dtype
    names it; None for an i-quant the writer does not write), and the grid is the block of the
    type's main tensor type in gguf-py's GGML_QUANT_SIZES (none for the floats)."""
    declared = gguf.LlamaFileType[name]
    path = header_file(tmp_path / "m.gguf", int(declared))
    truth = name.removeprefix("MOSTLY_").removeprefix("ALL_").lower()
    found = gguf_file_type(path)
    assert found == (None if truth.startswith("iq") else truth)
    grid = export_grid(path, ffn_width=1536)
    if found is None or found in ("f32", "f16", "bf16"):
        assert grid.block is None
        return
    main = found.upper().removesuffix("_S").removesuffix("_M").removesuffix("_L")
    assert grid.block == gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[main]][0]
    assert found.upper() in grid.reason


def test_a_file_without_a_declared_type_is_read_by_its_matrices(tmp_path: Path) -> None:
    path = header_file(tmp_path / "m.gguf", None, "Q8_0")
    assert gguf_file_type(path) == "q8_0"
    assert export_grid(path, 1536).block == 32


def test_the_grid_fills_only_a_prune_of_a_gguf_file_that_leaves_multiple_of_out(
    tmp_path: Path,
) -> None:
    """fill_grid: a K-quant source gives 256, a legacy one 32; a spec that sets multiple_of,
    one that does not prune, a width the block does not divide are left alone."""
    k_quant = header_file(tmp_path / "k.gguf", int(gguf.LlamaFileType.MOSTLY_Q4_K_M))
    legacy = header_file(tmp_path / "l.gguf", int(gguf.LlamaFileType.MOSTLY_Q4_1))

    def filled(source: Path, width: int = 1536, prune: bool = True, **model: int) -> object:
        data: dict[str, object] = {"model": {"ffn_width": width, **model},
                                   "reference": {"checkpoint": source.name}}  # fmt: skip
        if prune:
            data["prune"] = {}
        fill_grid(data, tmp_path)
        return data["model"].get("multiple_of")  # type: ignore[attr-defined]

    assert filled(k_quant) == 256 and filled(legacy) == 32
    assert filled(k_quant, multiple_of=64) == 64
    assert filled(k_quant, prune=False) is None
    assert filled(k_quant, width=1600) is None  # 1600 = 6.25 blocks of 256
    assert "do not divide the FFN width 1600" in export_grid(k_quant, 1600).reason


def test_validate_says_the_grid_and_why(tmp_path: Path) -> None:
    """A prune of a Q8_0 GGUF file (the tiny Qwen2): without model.multiple_of its widths are in
    multiples of 32, the blocks of the export's Q8_0; with multiple_of = 8, validate says those
    are not whole blocks and what a down projection off them is stored as."""
    import json

    import test_select

    spec = test_select.gguf_prune_spec(tmp_path)
    data = tomlkit.parse(spec.read_text())
    del data["model"]["multiple_of"]  # type: ignore[union-attr]
    spec.write_text(tomlkit.dumps(data))
    runner = CliRunner()
    result = runner.invoke(cli, ["validate", str(spec)])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert (
        "width grid: FFN widths in multiples of 32: the blocks of the export's Q8_0, the source "
        "file's type" in said
    )
    resolved = json.loads(runner.invoke(cli, ["validate", str(spec), "--json"]).output)
    assert resolved["model"]["multiple_of"] == 32
    result = runner.invoke(cli, ["validate", str(spec), "--set", "model.multiple_of=8"])
    said = " ".join(result.output.split())
    assert (
        "width grid: FFN widths in multiples of 8 (model.multiple_of), not whole blocks of the "
        "export's Q8_0 (32): a down projection whose width is off that grid is stored as F16"
        in said
    )


def test_validate_says_what_each_keep_keeps_where_the_grid_moves_it(tmp_path: Path) -> None:
    """Every arm's budget is the uniform width rounded to the grid, so a keep fraction off the
    grid keeps another share (Qwen2.5-Coder-1.5B at keep 0.5 on 256s: 4,608 of 8,960, 0.514):
    validate names it, by the closed form round(keep * width / grid) * grid."""
    import json

    import test_select

    spec = test_select.gguf_prune_spec(tmp_path)
    data = tomlkit.parse(spec.read_text())
    del data["model"]["multiple_of"]  # type: ignore[union-attr]
    spec.write_text(tomlkit.dumps(data))
    runner = CliRunner()
    resolved = json.loads(runner.invoke(cli, ["validate", str(spec), "--json"]).output)
    width, grid = resolved["model"]["ffn_width"], resolved["model"]["multiple_of"]
    keep = next(
        k / 100 for k in range(30, 100) if round(k / 100 * width / grid) * grid != k / 100 * width
    )
    kept = round(keep * width / grid) * grid
    result = runner.invoke(cli, ["validate", str(spec), "--set", f"prune.keep={keep}"])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert (
        f"on this grid keep {keep:g} keeps {kept:,} of {width:,} a layer ({kept / width:.3f})"
        in said
    )
    on_grid = grid * (width // grid // 2) / width  # a keep the grid leaves as it is
    result = runner.invoke(cli, ["validate", str(spec), "--set", f"prune.keep={on_grid}"])
    assert "on this grid" not in " ".join(result.output.split())
