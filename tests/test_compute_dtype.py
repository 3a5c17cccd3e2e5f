"""The compute dtype of forward passes on a reference (``compute_dtype`` in [probe], [diagnose],
[demand] and [prune]) and the CPU threads (``--threads``): how "auto" resolves, what is refused,
what autocast computes, and a prune computed in bfloat16 against the same prune in float32."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner
from test_prune import invoke, plain_loss, prune_spec

from geospec.cli import cli
from geospec.engine.precision import computing
from geospec.errors import UsageError
from geospec.hardware import (
    available_cores,
    check_threads,
    cpu_computes_bf16,
    resolve_compute_dtype,
)

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_torch_thread")]

#: How far a pruned model's held-out loss may move when its matrix products round their inputs
#: to bfloat16 (8 significant bits: a relative error of at most 2^-9 per input): on SmolLM2-135M
#: cut to half its neurons the largest move of a model's mean loss under autocast was 0.02 nats
#: (docs/prune.md, "Compute dtype"); a tiny random model's logits are small, so its moves are
#: far below that.
BF16_LOSS_TOLERANCE = 0.02


@pytest.mark.parametrize(
    ("flags", "native"),
    [
        ("fpu sse avx512f avx512_bf16 avx512_vnni", True),
        ("fpu sse avx512f amx_bf16 amx_tile", True),
        ("fpu sse avx2 fma", False),
    ],
)
def test_the_cpus_bf16_support_is_read_from_its_flags(
    tmp_path: Path, flags: str, native: bool
) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nmodel name\t: test\nflags\t\t: {flags}\n")
    assert cpu_computes_bf16(cpuinfo) is native
    assert cpu_computes_bf16(tmp_path / "missing") is False


def test_arm_cpus_with_feat_bf16_compute_it(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n")
    assert cpu_computes_bf16(cpuinfo)


def test_auto_is_bfloat16_only_where_the_hardware_computes_it() -> None:
    field = "prune.compute_dtype"
    assert resolve_compute_dtype("auto", "cpu", "float32", field, native_bf16=True) == (
        "bfloat16",
        None,
    )
    assert resolve_compute_dtype("auto", "cpu", "float32", field, native_bf16=False) == (
        "float32",
        None,
    )
    assert resolve_compute_dtype("float32", "cpu", "float32", field, True) == ("float32", None)
    assert resolve_compute_dtype("float16", "cuda", "float32", field, True) == ("float16", None)


def test_bfloat16_without_native_support_is_computed_with_a_warning_that_says_the_cost() -> None:
    dtype, warning = resolve_compute_dtype(
        "bfloat16", "cpu", "float32", "prune.compute_dtype", native_bf16=False
    )
    assert dtype == "bfloat16"
    assert warning is not None and "prune.compute_dtype" in warning and "slower" in warning


def test_a_model_loaded_narrow_computes_in_its_own_dtype() -> None:
    """reference.dtype = "bfloat16" computes in bfloat16 (what it did before compute_dtype);
    asking for the other narrow dtype is refused, naming both fields."""
    assert resolve_compute_dtype("float32", "cpu", "bfloat16", "f", True) == ("bfloat16", None)
    assert resolve_compute_dtype("auto", "cpu", "bfloat16", "f", False) == ("bfloat16", None)
    with pytest.raises(UsageError, match=r"probe\.compute_dtype.*reference\.dtype"):
        resolve_compute_dtype("float16", "cuda", "bfloat16", "probe.compute_dtype", True)


@pytest.mark.parametrize("requested", ["float16", "int8"])
def test_float16_on_a_cpu_and_unknown_dtypes_are_refused(requested: str) -> None:
    with pytest.raises(UsageError, match=r"^demand\.compute_dtype"):
        resolve_compute_dtype(requested, "cpu", "float32", "demand.compute_dtype", True)


def test_autocast_rounds_matrix_product_inputs_and_float32_inside_undoes_it() -> None:
    """Under bfloat16 a linear layer computes on its inputs and weights rounded to bfloat16 (the
    product of the rounded tensors, in float32, rounded once more); a float32 block nested in
    it computes the exact float32 product, as a prune's float32 stage does inside a bf16 one."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 32)
    x = torch.randn(8, 64)
    exact = F.linear(x, layer.weight, layer.bias)
    rounded = F.linear(
        x.bfloat16().float(), layer.weight.bfloat16().float(), layer.bias.bfloat16().float()
    )
    with torch.no_grad(), computing("bfloat16", "cpu"):
        narrow = layer(x)
        with computing("float32", "cpu"):
            inner = layer(x)
    assert narrow.dtype == torch.bfloat16
    assert torch.allclose(narrow.float(), rounded, rtol=2**-7, atol=1e-6)
    assert not torch.allclose(narrow.float(), exact, rtol=1e-6, atol=0)
    assert inner.dtype == torch.float32 and torch.equal(inner, exact.detach())


def test_threads_are_checked_against_the_cores_this_process_may_use() -> None:
    cores = available_cores()
    assert check_threads(None) == cores and check_threads(1) == 1
    for bad in (0, cores + 1):
        with pytest.raises(UsageError, match=rf"--threads {bad}: give 1 to {cores}"):
            check_threads(bad)


@pytest.mark.parametrize("command", ["prune", "run", "diagnose", "demand"])
def test_bad_threads_are_one_line_and_exit_2(tmp_path: Path, command: str) -> None:
    result = CliRunner().invoke(cli, [command, "missing.toml", "--threads", "0"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        f"error: --threads 0: give 1 to {available_cores()} (the cores this process may use); "
        "to share the machine, give each job its share"
    ]


def test_an_unknown_compute_dtype_names_the_field_exit_2(tmp_path: Path) -> None:
    spec = prune_spec(tmp_path, compute_dtype="half")
    result = CliRunner().invoke(cli, ["validate", str(spec)])
    assert result.exit_code == 2 and "prune.compute_dtype" in result.output
    assert "Traceback" not in result.output


@pytest.fixture(scope="module")
def float32_and_bfloat16(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The same prune computed in float32 (compute_dtype left out) and in bfloat16."""
    directory = tmp_path_factory.mktemp("dtype")
    plain, narrow = directory / "float32", directory / "bfloat16"
    invoke("prune", str(prune_spec(plain)))
    invoke("prune", str(prune_spec(narrow, compute_dtype="bfloat16")))
    return plain, narrow


def test_a_bfloat16_prune_says_so_and_never_shares_a_key_with_float32(
    float32_and_bfloat16: tuple[Path, Path],
) -> None:
    plain, narrow = (
        json.loads((d / "run" / "prune.json").read_text()) for d in float32_and_bfloat16
    )
    assert plain["compute_dtype"] == "float32" and narrow["compute_dtype"] == "bfloat16"
    assert plain["key"] != narrow["key"]
    report = (float32_and_bfloat16[1] / "run" / "prune" / "report.md").read_text()
    assert "Computed in bfloat16 (prune.compute_dtype)" in report
    plain_report = (float32_and_bfloat16[0] / "run" / "prune" / "report.md").read_text()
    assert "Computed in float32." in plain_report


def test_float32_named_keeps_the_key_of_a_prune_from_before_compute_dtype(
    float32_and_bfloat16: tuple[Path, Path],
) -> None:
    """compute_dtype = "float32" computes what every prune computed before the option existed:
    the finished float32 run is reused whole."""
    plain = float32_and_bfloat16[0]
    output = invoke("prune", str(plain / "spec.toml"), "--set", 'prune.compute_dtype="float32"')
    assert "prune: up to date" in output and "pruned models" not in output


def test_bfloat16_losses_agree_with_float32_within_the_rounding(
    float32_and_bfloat16: tuple[Path, Path],
) -> None:
    """Every unit's held-out loss in bfloat16 is within the measured tolerance of the float32
    prune's, and the exported bf16 unit (exported from the unrounded weights) scores, under
    plain transformers and torch's autocast, what the bf16 prune recorded."""
    plain, narrow = (
        json.loads((d / "run" / "prune.json").read_text()) for d in float32_and_bfloat16
    )
    compared = 0
    for budget_f, budget_b in zip(plain["budgets"], narrow["budgets"], strict=True):
        for arm, found in budget_f["arms"].items():
            other = budget_b["arms"][arm]
            for corpus, by_seed in found["loss"].items():
                for seed, loss in by_seed.items():
                    if found["widths"][seed] == other["widths"][seed]:
                        assert other["loss"][corpus][seed] == pytest.approx(
                            loss, abs=BF16_LOSS_TOLERANCE
                        ), (arm, corpus, seed)
                        compared += 1
    assert compared > 0
    directory = float32_and_bfloat16[1]
    unit = directory / "run" / "prune" / "keep-0.5" / "owl" / "seed-1"
    recorded = narrow["budgets"][1]["arms"]["owl"]["loss"]["docs.jsonl"]["1"]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert plain_loss(directory, unit / "model") == pytest.approx(recorded, abs=1e-3)
