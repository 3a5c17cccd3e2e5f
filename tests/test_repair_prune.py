"""The least-squares repair through `geospec prune`: its record, its exports, resuming and
damage, and the deprecated `compensate` spelling."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
import transformers as hf
from test_prune import invoke, plain_loss, prune_spec

import geospec
from geospec.prune.repair import load_refits
from geospec.rundir.layout import REPAIR_FILE
from geospec.spec.sections import PruneSpec

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_torch_thread")]

ARMS = [
    {"name": "uniform", "schedule": {"kind": "uniform"}},
    {"name": "uniform-mean", "schedule": {"kind": "uniform"}, "repair": "mean"},
    {"name": "uniform-lstsq", "schedule": {"kind": "uniform"}, "repair": "lstsq"},
    {
        "name": "uniform-sequential",
        "schedule": {"kind": "uniform"},
        "repair": "lstsq",
        "lstsq": {"inputs": "sequential", "damping": 0.1},
    },
    {"name": "flap-lstsq", "schedule": {"kind": "flap"}, "repair": "lstsq"},
]


@pytest.fixture(scope="module")
def repaired_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("repair")
    spec = prune_spec(directory, arms=ARMS, keep=0.5, calibration={"windows": 8, "seeds": [0, 1]})
    invoke("prune", str(spec))
    return directory


def unit(run: Path, arm: str, seed: int = 0) -> Path:
    return run / "run" / "prune" / "keep-0.5" / arm / f"seed-{seed}"


def losses(run: Path) -> dict[str, float]:
    record = json.loads((run / "run" / "prune.json").read_text())
    arms = record["budgets"][0]["arms"]
    return {name: arm["loss"]["docs.jsonl"]["0"] for name, arm in arms.items()}


def test_each_repaired_unit_records_its_refits_and_the_others_none(repaired_run: Path) -> None:
    for arm in ("uniform-lstsq", "uniform-sequential", "flap-lstsq"):
        for seed in (0, 1):
            key = json.loads((unit(repaired_run, arm, seed) / "result.json").read_text())["key"]
            refits, problem = load_refits(unit(repaired_run, arm, seed) / REPAIR_FILE, key)
            assert problem is None and refits is not None and len(refits) == 3
            assert all(r is not None and r.weight.shape == (32, 32) for r in refits)
    for arm in ("uniform", "uniform-mean"):
        assert not (unit(repaired_run, arm) / REPAIR_FILE).exists()
    one_pass = load_refits(unit(repaired_run, "uniform-lstsq") / REPAIR_FILE, "x")
    assert one_pass[1] is not None  # a record is read for its own key only
    found = [losses(repaired_run)[arm] for arm in ("uniform", "uniform-mean", "uniform-lstsq",
             "uniform-sequential")]  # fmt: skip
    assert len(set(found)) == len(found)  # every repair changed the model


@pytest.mark.parametrize("arm", ["uniform-lstsq", "uniform-sequential", "flap-lstsq"])
def test_a_repaired_export_scores_the_recorded_loss_in_plain_transformers(
    repaired_run: Path, arm: str
) -> None:
    """The true-width export carries the re-fitted down projections and their bias (a Llama
    with mlp_bias): plain transformers on it gives the loss the prune recorded."""
    model_dir = unit(repaired_run, arm) / "model"
    model = geospec.load_pruned(model_dir)
    assert type(model) is hf.LlamaForCausalLM and model.config.mlp_bias is True
    refits, _ = load_refits(
        unit(repaired_run, arm) / REPAIR_FILE,
        json.loads((unit(repaired_run, arm) / "result.json").read_text())["key"],
    )
    assert refits is not None and refits[0] is not None
    torch.testing.assert_close(model.model.layers[0].mlp.down_proj.weight, refits[0].weight)
    assert plain_loss(repaired_run, model_dir) == pytest.approx(losses(repaired_run)[arm], 1e-5)


def test_a_rerun_reuses_every_repair(repaired_run: Path) -> None:
    path = unit(repaired_run, "uniform-lstsq", 1) / REPAIR_FILE
    stamp = path.stat().st_mtime_ns
    before = losses(repaired_run)
    invoke("prune", str(repaired_run / "spec.toml"))
    assert path.stat().st_mtime_ns == stamp and losses(repaired_run) == before


@pytest.mark.parametrize("damage", ["edited", "truncated", "stale"])
def test_a_damaged_repair_record_is_named_and_recomputed(repaired_run: Path, damage: str) -> None:
    """The unit's record gone too (as after a kill between the repair and the record), its
    repair is read back only when it is whole and its own: an edited, truncated or another
    computation's file is named and computed again, to the same losses."""
    before = losses(repaired_run)
    target = unit(repaired_run, "uniform-sequential")
    path = target / REPAIR_FILE
    data = bytearray(path.read_bytes())
    if damage == "edited":
        data[-5] ^= 0x10
        path.write_bytes(bytes(data))
    elif damage == "truncated":
        path.write_bytes(bytes(data[:100]))
    else:
        other = unit(repaired_run, "uniform-lstsq") / REPAIR_FILE
        path.write_bytes(other.read_bytes())
    (target / "result.json").unlink()
    (repaired_run / "run" / "prune.json").unlink()
    output = invoke("prune", str(repaired_run / "spec.toml"))
    said = {
        "edited": "changed after geospec wrote them",
        "truncated": "cannot be read",
        "stale": "written for another computation",
    }
    assert said[damage] in " ".join(output.split())
    assert losses(repaired_run) == before


def test_a_kill_after_the_repair_resumes_from_its_record(repaired_run: Path) -> None:
    """A prune killed after the repair was written but before the unit's record: the rerun
    reads the repair back (not computed again) and ends with the same losses."""
    before = losses(repaired_run)
    target = unit(repaired_run, "flap-lstsq", 1)
    stamp = (target / REPAIR_FILE).stat().st_mtime_ns
    (target / "result.json").unlink()
    (repaired_run / "run" / "prune.json").unlink()
    invoke("prune", str(repaired_run / "spec.toml"))
    assert (target / REPAIR_FILE).stat().st_mtime_ns == stamp
    assert losses(repaired_run) == before


def test_compensate_is_repairs_deprecated_name_and_keeps_its_keys() -> None:
    """`compensate = "mean"` still prunes as `repair = "mean"` with a DeprecationWarning; the
    spec keys of specs written before repair existed are unchanged; both at once is refused."""
    from geospec.pipeline.keys import section

    arms = [{"name": "uniform", "schedule": {"kind": "uniform"}}]
    with pytest.warns(DeprecationWarning, match='prune.repair = "mean"'):
        old = PruneSpec.model_validate({"arms": arms, "compensate": "mean"})
    with pytest.warns(DeprecationWarning, match="arm 'uniform'"):
        arm = PruneSpec.model_validate({"arms": [arms[0] | {"compensate": "mean"}]})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        new = PruneSpec.model_validate({"arms": arms, "repair": "mean"})
        plain = PruneSpec.model_validate({"arms": arms})
    for spec in (old, arm, new):
        assert spec.repair_of(spec.arms[0]) == "mean" and spec.compensates(spec.arms[0])
    assert section(old)["compensate"] == "mean" and "repair" not in section(old)
    assert "repair" not in section(plain) and "lstsq" not in section(plain)
    with pytest.raises(ValueError, match="compensate is repair's old name"):
        PruneSpec.model_validate({"arms": arms, "compensate": "mean", "repair": "lstsq"})
    lstsq = PruneSpec.model_validate({"arms": arms, "repair": "lstsq"})
    assert lstsq.refits(lstsq.arms[0]) and lstsq.biased(lstsq.arms[0])
    assert lstsq.lstsq_of(lstsq.arms[0]).damping == 0.1
    bare = PruneSpec.model_validate(
        {"arms": arms, "repair": "lstsq", "lstsq": {"intercept": False}}
    )
    assert bare.refits(bare.arms[0]) and not bare.biased(bare.arms[0])  # exports anywhere


def test_validate_estimates_the_repair_and_refuses_one_that_cannot_fit(tmp_path: Path) -> None:
    """validate prints the repair's memory and time (its float64 moments are width^2 x 8 bytes
    per layer: every layer's in one pass, one layer's in the sequential walk) and refuses, in
    one line naming the fix, a repair larger than the memory left."""
    from click.testing import CliRunner

    from geospec.cli import cli
    from geospec.spec.file_checks import repair_memory_problem
    from geospec.spec.loading import load_spec

    arms = [
        {"name": "uniform", "schedule": {"kind": "uniform"}, "repair": "lstsq"},
        {"name": "walk", "schedule": {"kind": "uniform"}, "repair": "lstsq",
         "lstsq": {"inputs": "sequential"}},
    ]  # fmt: skip
    spec_file = prune_spec(tmp_path, arms=arms, keep=0.5)
    result = CliRunner().invoke(cli, ["validate", str(spec_file)])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    one_layer = 8 * (64 * 64 + 64)  # the word checkpoint: 3 layers of 64 neurons
    assert f"float64 moments {one_layer * 3 / 1024:.1f} KiB: every layer's, one pass" in said
    assert f"float64 moments {one_layer / 1024:.1f} KiB: one layer's at a time" in said
    assert "output projections re-fitted by least squares" in said
    spec = load_spec(spec_file)
    assert repair_memory_problem(spec, free=10**9) is None
    # room for one layer's moments, not for all three: the one-pass repair is refused, with
    # the sequential walk as its fix; with room for neither, fewer windows are the fix
    line = repair_memory_problem(spec, free=180 * 1024)
    assert line is not None and line.startswith("prune.lstsq: the repair of uniform needs")
    assert "every layer's, one pass" in line and "\n" not in line
    assert line.endswith('set prune.lstsq.inputs = "sequential" (one layer\'s moments at a time)')
    line = repair_memory_problem(spec, free=1000)
    assert line is not None and line.endswith("lower prune.lstsq.windows or model.seq_len, or use "
                                              "a larger machine")  # fmt: skip


def test_a_bfloat16_prune_repairs_from_bfloat16_activations_solved_in_float64(
    tmp_path: Path,
) -> None:
    """compute_dtype = "bfloat16": the activations the moments read are bfloat16 (autocast),
    the moments and the solve float64, the re-fitted weights the model's float32; the repaired
    model's loss is the float32 one's to bfloat16's rounding."""
    arms = [{"name": "lstsq", "schedule": {"kind": "uniform"}, "repair": "lstsq"}]
    found = {}
    for dtype in ("float32", "bfloat16"):
        directory = tmp_path / dtype
        directory.mkdir()
        spec = prune_spec(
            directory, arms=arms, baseline="lstsq", keep=0.5, export=False,
            calibration={"windows": 8, "seeds": [0]}, compute_dtype=dtype,
        )  # fmt: skip
        invoke("prune", str(spec))
        key = json.loads((unit(directory, "lstsq") / "result.json").read_text())["key"]
        refits, problem = load_refits(unit(directory, "lstsq") / REPAIR_FILE, key)
        assert problem is None and refits is not None
        found[dtype] = (refits, losses(directory)["lstsq"])
    (exact, exact_loss), (rounded, rounded_loss) = found["float32"], found["bfloat16"]
    for one, other in zip(exact, rounded, strict=True):
        assert one is not None and other is not None and other.weight.dtype == torch.float32
        assert not torch.equal(one.weight, other.weight)  # bfloat16 activations: not the same
    assert rounded_loss == pytest.approx(exact_loss, abs=0.02)
