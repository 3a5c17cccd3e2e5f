"""probe.replicates: every profile measured on R disjoint token samples; profiles.json keeps the
replicates, the solver uses their mean, the report shows error bars and split-half reliability."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from geospec.cli import cli
from geospec.measure.probe import ProbeError, sample_tokens
from geospec.pipeline.keys import section
from geospec.report.write import write_report
from geospec.spec.sections import ProbeSpec, ReportSpec
from geospec.stats import split_half_reliability, standard_errors

TOKENS = np.random.default_rng(0).integers(0, 50, size=64 * 40)


def test_one_replicate_is_the_sample_drawn_as_before() -> None:
    """R = 1 draws exactly what the single sample always drew: the windows, then the positions
    among the eligible ones, from one seeded generator."""
    sample = sample_tokens(TOKENS, 64, 100, seed=5, skip_first=2, skip_ids=[7])
    rng = np.random.default_rng(5)
    sequences = math.ceil(4 * 100 / 62)
    windows = np.sort(rng.choice(40, size=sequences, replace=False)) * 64
    grid = windows[:, None] + np.arange(64)[None, :]
    eligible = (np.arange(64)[None, :] >= 2) & (TOKENS[grid] != 7)
    chosen = np.sort(rng.choice(np.flatnonzero(eligible), size=100, replace=False))
    assert np.array_equal(sample.windows, windows)
    assert np.array_equal(sample.window_index, chosen // 64)
    assert np.array_equal(sample.positions, chosen % 64)


def test_replicates_are_disjoint_samples_from_their_own_windows() -> None:
    sample = sample_tokens(TOKENS, 64, 30, seed=1, sequences=4, skip_first=1, replicates=3)
    assert len(sample.windows) == 12 and len(set(sample.windows.tolist())) == 12
    assert len(sample.positions) == 90
    for r in range(3):
        part = slice(30 * r, 30 * (r + 1))
        own = sample.window_index[part]
        assert set(own.tolist()) <= set(range(4 * r, 4 * r + 4))  # its own four windows
        assert np.all(np.diff(own) >= 0) and np.all(sample.positions[part] >= 1)
    starts = sample.windows[sample.window_index] + sample.positions
    assert len(set(starts.tolist())) == 90  # no token position is in two replicates


def test_too_few_windows_for_the_replicates() -> None:
    with pytest.raises(ProbeError, match=r"probe\.replicates 5 x 10 windows exceeds the 40"):
        sample_tokens(TOKENS, 64, 30, seed=0, sequences=10, replicates=5)


def test_one_replicate_leaves_the_keys_unchanged() -> None:
    assert "replicates" not in section(ProbeSpec())
    assert section(ProbeSpec(replicates=4))["replicates"] == 4
    assert "min_reliability" not in section(ReportSpec())


SPEC = """
name = "replicates-test"

[model]
n_layers = 3
d_model = 16
n_heads = 2
ffn_width = 32
seq_len = 32
multiple_of = 8

[data]
source = "bundled:austen"
tokenizer = { kind = "bpe", vocab_size = 300 }
max_documents = 300

[reference]
train_steps = 3

[probe]
tokens = 24
replicates = 3

[[measure]]
geometry = { kind = "spherical" }
statistic = { kind = "shift" }

[[arms]]
name = "uniform"
schedule = { kind = "uniform" }

[[arms]]
name = "shift-spherical"
schedule = { kind = "geometric", profile = "shift/spherical" }

[[arms]]
name = "sorted-uniform"
schedule = { kind = "sorted", of = "uniform" }

[train]
steps = 3
batch_size = 4
threads = 1
"""


@pytest.mark.torch
def test_profiles_are_measured_on_each_replicate_and_solved_on_their_mean(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file

    from geospec import measure_profiles

    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC)
    run_dir = tmp_path / "run"
    result = CliRunner().invoke(cli, ["run", str(spec), "--out", str(run_dir), "--until", "solve"])
    assert result.exit_code == 0, result.output
    note = "note: sorted-uniform has exactly the widths of its source arm 'uniform'"
    assert note in result.output
    meta = json.loads((run_dir / "clouds" / "meta.json").read_text())
    assert meta["replicates"] == 3 and meta["tokens"] == 72
    stored = json.loads((run_dir / "profiles.json").read_text())
    replicates = stored["replicates"]["shift/spherical"]
    assert len(replicates) == 3 and all(len(r) == 3 for r in replicates)
    mean = np.mean(replicates, axis=0)
    assert stored["profiles"]["shift/spherical"] == pytest.approx(list(mean), rel=1e-12)
    clouds = [load_file(str(p)) for p in sorted((run_dir / "clouds").glob("layer-*"))]
    for r in range(3):  # replicate r is rows 24r .. 24r + 23 of every layer's clouds
        part = [(c["x"][24 * r : 24 * (r + 1)], c["y"][24 * r : 24 * (r + 1)]) for c in clouds]
        alone = measure_profiles(part, ["shift/spherical"], workers=1)["shift/spherical"]
        assert alone == pytest.approx(replicates[r], rel=1e-6)
    assert all(isinstance(c["x"], torch.Tensor) for c in clouds)

    from geospec.solve.widths import compute_widths
    from geospec.spec import load_spec

    loaded = load_spec(spec)
    expected = compute_widths(loaded.model, loaded.arms, {"shift/spherical": list(mean)})
    widths = json.loads((run_dir / "widths.json").read_text())["arms"]
    assert widths["shift-spherical"]["widths"] == expected.widths["shift-spherical"]


def write_profiles_run(run_dir: Path, replicates: dict[str, list[list[float]]]) -> None:
    run_dir.mkdir()
    run = {
        "name": "profiles-only",
        "baseline": "uniform",
        "confidence": 0.95,
        "bootstrap": 0,
        "min_reliability": 0.8,
        "arms": [
            {"name": "uniform", "schedule": {"kind": "uniform"}},
            {"name": "noisy", "schedule": {"kind": "geometric", "profile": "noisy/raw"}},
        ],
        "seeds": [0],
    }
    (run_dir / "run.json").write_text(json.dumps(run))
    means = {name: list(np.mean(values, axis=0)) for name, values in replicates.items()}
    profiles = {"profiles": means, "keys": {}, "replicates": replicates}
    (run_dir / "profiles.json").write_text(json.dumps(profiles))


def test_the_report_shows_error_bars_and_flags_unreliable_profiles(
    tmp_path: Path, geospec_registries: object
) -> None:
    rng = np.random.default_rng(3)
    shape = np.linspace(4.0, 1.0, 8)
    replicates = {
        "stable/raw": (shape + rng.normal(0, 0.01, (4, 8))).tolist(),
        "noisy/raw": (1.0 + rng.normal(0, 0.3, (4, 8))).tolist(),
    }
    write_profiles_run(tmp_path / "run", replicates)
    results = write_report(tmp_path / "run")
    entries = results["reliability"]["profiles"]
    for name, values in replicates.items():
        assert entries[name]["replicates"] == 4
        assert entries[name]["se"] == pytest.approx(standard_errors(values))
        assert entries[name]["split_half"] == pytest.approx(split_half_reliability(values))
    assert entries["stable/raw"]["split_half"] == pytest.approx(1.0)
    assert not entries["stable/raw"]["below_threshold"]
    [note] = [n for n in results["notes"] if "noisy/raw" in n]
    assert entries["noisy/raw"]["below_threshold"] and "arms reading it: noisy" in note
    report = (tmp_path / "run" / "report.md").read_text()
    assert "## Profile reliability" in report and "**below 0.8**" in report
    assert (tmp_path / "run" / "plots" / "profiles.png").stat().st_size > 1000
