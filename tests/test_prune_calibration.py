"""What a prune's widths are measured from: the training split only (no eval window reaches a
width, a profile or a diagnose/demand number), and, with prune.allocation_seeds, each
calibration seed's own probe sample."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tomlkit
import torch
import torch.nn.functional as F
import transformers as hf
from test_prune import invoke, prune_spec, word_corpus

from geospec.engine.token_data import TokenData, prepare_data, split_fractions
from geospec.spec.loading import load_spec

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_torch_thread")]

ARMS = [
    {"name": "uniform", "schedule": {"kind": "uniform"}},
    {"name": "flap", "schedule": {"kind": "flap"}},
    {"name": "shift", "schedule": {"kind": "geometric", "profile": "shift/spherical"}},
    {"name": "norm", "schedule": {"kind": "geometric", "profile": "residual_norm/mean"}},
    # the least-squares repair fits the kept weights to text: the calibration text only
    {"name": "lstsq", "schedule": {"kind": "uniform"}, "repair": "lstsq"},
    {
        "name": "sequential",
        "schedule": {"kind": "geometric", "profile": "shift/spherical"},
        "repair": "lstsq",
        "lstsq": {"inputs": "sequential", "windows": 4},
    },
    # the search reads the calibration windows many times over: still training text only
    {
        "name": "evolve",
        "schedule": {
            "kind": "evolve",
            "start_arm": "shift",
            "generations": 2,
            "offspring": 3,
            "stages": [{"tokens": 30, "survivors": 2}, {"tokens": 60, "survivors": 1}],
        },
    },
]
DIAGNOSE = {"enabled": True, "windows": 5, "batch_size": 4, "pairs": 2}
DEMAND = {"enabled": True, "keep": [0.75, 0.5], "windows": 3, "pairs": 1, "pair_keep": 0.5}


def leak_spec(directory: Path, split: str | None = None) -> Path:
    """The tiny prune of tests/test_prune.py with diagnose and demand on and an arm reading each
    kind of input (a measured and a diagnostic profile, the scores, the calibration windows
    searched on); ``split`` sets
    probe.calibration_split (None: the prune's default)."""
    path = prune_spec(
        directory, arms=ARMS, keep=0.5, export=False, calibration={"windows": 8, "seeds": [0, 1]}
    )
    spec = tomlkit.parse(path.read_text())
    spec["diagnose"], spec["demand"] = DIAGNOSE, DEMAND
    if split is not None:
        spec["probe"]["calibration_split"] = split
    path.write_text(tomlkit.dumps(spec))
    return path


def validation_documents(lines: int) -> list[int]:
    """Which documents of a corpus of ``lines`` documents [data]'s split (val_fraction 0.05,
    split_seed 0) holds out."""
    return [int(i) for i in np.flatnonzero(split_fractions(np.arange(lines), 0) < 0.05)]


def edit_eval_text(directory: Path) -> None:
    """Rewrite what the eval windows read: the held-out documents of docs.jsonl ([data]'s own
    corpus, an eval corpus) and all of other.jsonl (an eval-only corpus)."""
    docs = (directory / "docs.jsonl").read_text().splitlines()
    fresh = word_corpus(directory / "fresh.jsonl", seed=7).read_text().splitlines()
    for i in validation_documents(len(docs)):
        docs[i] = fresh[i]
    (directory / "docs.jsonl").write_text("\n".join(docs))
    word_corpus(directory / "other.jsonl", 8, lines=40)


def tokens(directory: Path) -> TokenData:
    spec = load_spec(directory / "spec.toml")
    return prepare_data(spec.data, directory / "cache", spec_dir=directory)


def stage_records(run: Path) -> dict[str, Any]:
    """Everything the stages before prune wrote that a width can depend on."""
    records: dict[str, Any] = {}
    for name in ("profiles.json", "diagnostics.json", "demand.json", "clouds/meta.json"):
        stored = json.loads((run / name).read_text())
        # the keys (and the seal over them) hash the run's own paths: two directories differ
        records[name] = {k: v for k, v in stored.items() if k not in ("keys", "digest")}
    records["clouds"] = {p.name: p.read_bytes() for p in sorted((run / "clouds").glob("*.safe*"))}
    return records


def widths_and_losses(run: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    record = json.loads((run / "prune.json").read_text())
    arms = record["budgets"][0]["arms"]
    widths = {name: arm["widths"] for name, arm in arms.items()}
    losses = {name: arm["loss"] for name, arm in arms.items()} | {"": record["reference"]}
    return widths, losses


@pytest.fixture(scope="module")
def leak_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same prune on the original text and with the eval text rewritten, each in a fresh
    directory (so nothing is reused), calibrating on the training split (the default) and, as
    the control that shows the edit is visible to what reads the validation split, on it."""
    runs = {}
    for split in ("train", "val"):
        for edited in (False, True):
            directory = tmp_path_factory.mktemp(f"{split}-{'edited' if edited else 'original'}")
            spec = leak_spec(directory, None if split == "train" else "val")
            if edited:
                edit_eval_text(directory)
            invoke("prune", str(spec))
            runs[f"{split}-{'edited' if edited else 'original'}"] = directory
    return runs


def test_the_edit_changes_the_eval_windows_and_no_training_token(
    leak_runs: dict[str, Path],
) -> None:
    original, edited = tokens(leak_runs["train-original"]), tokens(leak_runs["train-edited"])
    assert np.array_equal(original.train, edited.train)
    assert not np.array_equal(original.val[: 6 * 16 + 1], edited.val[: 6 * 16 + 1])


def test_editing_the_eval_windows_changes_only_the_scores(leak_runs: dict[str, Path]) -> None:
    """Calibrating on the training split: the clouds, every profile, the diagnose and demand
    records and every arm's widths on both seeds are the same whatever the eval text says; the
    scores (pruned and unpruned) differ."""
    original, edited = leak_runs["train-original"], leak_runs["train-edited"]
    assert stage_records(original / "run") == stage_records(edited / "run")
    widths, losses = widths_and_losses(original / "run")
    widths_edited, losses_edited = widths_and_losses(edited / "run")
    assert widths == widths_edited
    for name, arm in losses.items():
        for corpus, values in arm.items():
            assert values != losses_edited[name][corpus], (name, corpus)


def test_editing_the_eval_windows_leaves_every_repair_as_it_was(
    leak_runs: dict[str, Path],
) -> None:
    """The repaired weights (one pass over the unpruned model, and the sequential walk over the
    model cut and repaired so far) are the same tensors whatever the eval text says."""
    from safetensors.torch import load_file

    for arm in ("lstsq", "sequential"):
        for seed in (0, 1):
            found = [
                load_file(leak_runs[run] / "run" / "prune" / "keep-0.5" / arm / f"seed-{seed}"
                          / "repair.safetensors")
                for run in ("train-original", "train-edited")
            ]  # fmt: skip
            assert found[0].keys() == found[1].keys() and found[0]
            for name, tensor in found[0].items():
                assert torch.equal(tensor, found[1][name]), (arm, seed, name)


def test_calibrating_on_the_validation_split_would_see_the_edit(
    leak_runs: dict[str, Path],
) -> None:
    """The control: with probe.calibration_split = "val" (the split earlier versions read) the
    same edit moves the clouds, the profiles and the diagnose and demand losses."""
    original = stage_records(leak_runs["val-original"] / "run")
    edited = stage_records(leak_runs["val-edited"] / "run")
    for name in ("clouds", "profiles.json"):
        assert original[name] != edited[name], name
    for name in ("diagnostics.json", "demand.json"):
        assert original[name]["loss"]["base"] != edited[name]["loss"]["base"], name


def plain_loss(model: Any, tokens: np.ndarray, windows: int, eot: int) -> float:
    """Plain cross-entropy of transformers' model on the first ``windows`` windows of 16 tokens
    (the end-of-text token packed after the last document is not text to predict)."""
    text = tokens[:-1] if int(tokens[-1]) == eot else tokens
    ids = torch.as_tensor(text[: windows * 16 + 1].astype(np.int64))
    x = torch.stack([ids[w * 16 : w * 16 + 16] for w in range(windows)])
    y = torch.stack([ids[w * 16 + 1 : w * 16 + 17] for w in range(windows)])
    with torch.no_grad():
        logits = model(input_ids=x).logits
    return float(F.cross_entropy(logits.flatten(0, 1).double(), y.flatten()))


def ffn_inputs(model: Any, tokens: np.ndarray, starts: list[int]) -> torch.Tensor:
    """Layer 0's residual stream entering its FFN's pre-norm at every position of the windows
    of 16 tokens at ``starts``, by transformers alone (one row per position)."""
    captured: list[torch.Tensor] = []
    norm = model.model.layers[0].post_attention_layernorm
    handle = norm.register_forward_pre_hook(lambda module, args: captured.append(args[0]))
    ids = torch.as_tensor(np.stack([tokens[s : s + 16].astype(np.int64) for s in starts]))
    with torch.no_grad():
        model(input_ids=ids)
    handle.remove()
    return captured[0].flatten(0, 1)


def test_probe_diagnose_and_demand_read_the_training_split(leak_runs: dict[str, Path]) -> None:
    """In a prune the unpruned losses diagnose and demand record are plain cross-entropy on the
    first training windows (not the validation ones), and every probed state is one that
    transformers computes at a position of the training windows the probe names."""
    from safetensors.torch import load_file

    directory = leak_runs["train-original"]
    run, data = directory / "run", tokens(directory)
    model = hf.AutoModelForCausalLM.from_pretrained(directory / "model").eval()
    for name, windows in (("diagnostics.json", 5), ("demand.json", 3)):
        base = json.loads((run / name).read_text())["loss"]
        assert base["windows"] == windows
        expected = plain_loss(model, data.train, windows, data.eot_id)
        assert base["base"] == pytest.approx(expected, rel=1e-5), name
        assert base["base"] != pytest.approx(plain_loss(model, data.val, windows, data.eot_id))
    from geospec.report import demand as demand_report
    from geospec.report import diagnostics as diagnose_report

    for lines in (
        diagnose_report.summary_lines(json.loads((run / "diagnostics.json").read_text())),
        demand_report.summary_lines(json.loads((run / "demand.json").read_text())),
    ):
        assert "training windows" in lines[0] and "validation" not in lines[0]
    meta = json.loads((run / "clouds" / "meta.json").read_text())
    assert meta["split"] == "train" and max(meta["windows"]) + 16 > len(data.val)  # past val
    cloud = load_file(str(run / "clouds" / "layer-000.safetensors"))["x"]
    nearest = torch.cdist(cloud, ffn_inputs(model, data.train, meta["windows"])).min(dim=1)
    assert nearest.values.max() < 1e-4
    # the same offsets into the validation split give other states
    starts = [w for w in meta["windows"] if w + 16 <= len(data.val)]
    if starts:
        other = torch.cdist(cloud, ffn_inputs(model, data.val, starts)).min(dim=1)
        assert other.values.max() > 1e-2


def test_a_prune_spec_defaults_to_the_training_split_and_training_studies_keep_their_keys(
    tmp_path: Path,
) -> None:
    from geospec.pipeline.keys import section
    from geospec.spec.sections import Spec
    from geospec.testing import minimal_spec

    study = Spec.model_validate(minimal_spec())
    assert study.probe.calibration_split == "val"
    assert "calibration_split" not in section(study.probe)  # its probe key is unchanged
    pruned = load_spec(leak_spec(tmp_path))
    assert pruned.probe.calibration_split == "train"
    assert section(pruned.probe)["calibration_split"] == "train"  # a prune's keys change
    (tmp_path / "val").mkdir()
    kept = load_spec(leak_spec(tmp_path / "val", "val"))
    assert kept.probe.calibration_split == "val"
    assert section(kept.probe) == section(study.probe.model_copy(update={"tokens": 64}))
    assert pruned.prune is not None and not pruned.prune.allocation_seeds
    assert "allocation_seeds" not in section(pruned.prune)  # existing prune keys: unchanged


def test_a_prune_without_training_text_is_refused_in_one_line(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from geospec.cli import cli

    spec = leak_spec(tmp_path)
    data = tomlkit.parse(spec.read_text())
    data["data"]["val_fraction"] = 1.0
    spec.write_text(tomlkit.dumps(data))
    result = CliRunner().invoke(cli, ["validate", str(spec)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "data.val_fraction" in result.output and "no training text" in result.output


# allocation seeds: seed k re-draws the probe sample the profiles are measured on


@pytest.fixture(scope="module")
def seeded_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("allocation-seeds")
    arms = [ARMS[0], ARMS[2], ARMS[3]]  # uniform, shift/spherical, residual_norm/mean
    spec = prune_spec(
        directory, arms=arms, keep=[0.75, 0.5], export=False, allocation_seeds=True,
        calibration={"windows": 8, "seeds": [0, 1, 2, 3]},
    )  # fmt: skip
    data = tomlkit.parse(spec.read_text())
    data["probe"]["tokens"] = 24  # a small sample: a noisy profile
    data["model"]["multiple_of"] = 1  # widths free to move by one neuron
    data["diagnose"] = DIAGNOSE
    spec.write_text(tomlkit.dumps(data))
    invoke("prune", str(spec))
    return directory


def test_allocation_seeds_move_the_widths_and_the_profiles(seeded_run: Path) -> None:
    """Each seed's widths keep the budget; the measured arm's (shift/spherical) are not the
    same on every seed; each unit records the profiles its seed measured, the measured and the
    diagnostic one (residual_norm/mean, whose 3% spread over seeds moves no width of this tiny
    model), and they differ between seeds."""
    record = json.loads((seeded_run / "run" / "prune.json").read_text())
    moved = []
    for budget in record["budgets"]:
        for name in ("shift", "norm"):
            widths = budget["arms"][name]["widths"]
            assert all(sum(w) == budget["budget"] for w in widths.values())
        moved.append(len({tuple(w) for w in budget["arms"]["shift"]["widths"].values()}) > 1)
        assert len({tuple(w) for w in budget["arms"]["uniform"]["widths"].values()}) == 1
    assert any(moved)
    units = seeded_run / "run" / "prune" / "keep-0.5" / "norm"
    measured = [json.loads((units / f"seed-{k}" / "result.json").read_text()) for k in range(4)]
    for name in ("shift/spherical", "residual_norm/mean"):
        assert len({tuple(unit["profiles"][name]) for unit in measured}) == 4, name


def test_a_seeded_loss_draw_reads_distinct_training_windows(prune_dir: Path) -> None:
    """Probe.loss_seed: the diagnose and demand losses of allocation seed k are measured on
    windows drawn with k, each one a window of the training split, other windows for another
    seed; without it, the first training windows."""
    from dataclasses import replace

    from rich.console import Console

    from geospec.engine.distributed import DistContext
    from geospec.pipeline.context import RunContext
    from geospec.pipeline.stages.probe import Probe

    spec = load_spec(prune_dir / "spec.toml")
    run = RunContext(prune_dir / "run", prune_dir, Console(quiet=True), DistContext(), "cpu")
    data = tokens(prune_dir)
    train = torch.as_tensor(data.train.astype(np.int64))
    windows = train[: (len(train) - 1) // 16 * 16].view(-1, 16)  # every training window
    drawn = {}
    for seed in (None, 1, 2):
        probe = replace(Probe.from_spec(spec), loss_seed=seed)
        setup = probe.loss_setup(run, windows=6, batch_size=4)
        x = torch.cat([inputs for inputs, _ in setup.batches])
        matches = (x[:, None, :] == windows[None, :, :]).all(dim=2)
        assert matches.any(dim=1).all()  # every input row is a training window
        drawn[seed] = [int(i) for i in matches.float().argmax(dim=1)]
    assert drawn[None] == list(range(6))
    assert len(set(drawn[1])) == 6 and drawn[1] == sorted(drawn[1])
    assert drawn[1] != drawn[2] and drawn[1] != drawn[None]


@pytest.fixture
def prune_dir(tmp_path: Path) -> Path:
    leak_spec(tmp_path)
    return tmp_path


def test_the_probe_seed_draws_the_runs_own_profiles_back(seeded_run: Path) -> None:
    """Seed 0 re-draws the sample probe.seed = 0 drew for the run: the widths of the arms read
    from it are those the same prune solves from the run's profiles without allocation seeds."""
    record = json.loads((seeded_run / "run" / "prune.json").read_text())
    copy = seeded_run.parent / "allocation-seeds-off"
    shutil.copytree(seeded_run, copy, ignore=shutil.ignore_patterns("run"))
    spec = copy / "spec.toml"
    data = tomlkit.parse(spec.read_text())
    data["out"] = str(copy / "run")
    data["prune"]["allocation_seeds"] = False
    data["prune"]["calibration"]["seeds"] = [0]
    spec.write_text(tomlkit.dumps(data))
    invoke("prune", str(spec))
    off = json.loads((copy / "run" / "prune.json").read_text())
    for on_budget, off_budget in zip(record["budgets"], off["budgets"], strict=True):
        for name in ("shift", "norm"):  # residual norms: from the same clouds
            seeded = on_budget["arms"][name]["widths"]["0"]
            assert seeded == off_budget["arms"][name]["widths"]["0"], name
