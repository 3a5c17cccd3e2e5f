"""`geospec run` end to end on a small spec: artifacts, equal budgets, report, resume, kill."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tomlkit
import torch
from click.testing import CliRunner
from processes import alive, process_tree
from safetensors.torch import load_file

from geospec.cli import cli
from geospec.storage.locks import claim

pytestmark = pytest.mark.torch

SPEC = """
name = "pipeline-test"

[model]
n_layers = 4
d_model = 32
n_heads = 2
ffn_width = 64
seq_len = 32
multiple_of = 8

[data]
source = "bundled:austen"
tokenizer = { kind = "bpe", vocab_size = 400 }
max_documents = 400

[probe]
tokens = 48
seed = 3

[[measure]]
geometry = { kind = "spherical" }
statistic = { kind = "shift" }

[[measure]]
geometry = { kind = "hyperbolic" }
statistic = { kind = "gw", coupling = "identity" }

[[arms]]
name = "uniform"
schedule = { kind = "uniform" }

[[arms]]
name = "cosine"
schedule = { kind = "cosine", start = 1.5, end = 0.5 }

[[arms]]
name = "shift-spherical"
schedule = { kind = "geometric", profile = "shift/spherical" }

[[arms]]
name = "anti"
schedule = { kind = "anti", profile = "gw/hyperbolic" }

[train]
steps = 40
batch_size = 8
lr = 3e-3
warmup = 5
seeds = [0, 1]
eval_interval = 20
eval_tokens = 4096
checkpoint_interval = 5
threads = 1

[report]
compare = [["shift-spherical", "cosine"]]
"""


def write_spec(directory: Path, text: str = SPEC, **train: object) -> Path:
    document = tomlkit.parse(text)
    document["out"] = str(directory / "run")
    for key, value in train.items():
        document["train"][key] = value  # type: ignore[index]
    path = directory / "spec.toml"
    path.write_text(tomlkit.dumps(document))
    return path


def run(spec: Path, *args: str) -> str:
    result = CliRunner().invoke(cli, ["run", str(spec), *args])
    assert result.exit_code == 0, result.output + repr(result.exception)
    return result.output


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The spec run to the end; its output is kept in output.txt. The reference is trained with
    the train section's steps and seed 0, so it is exactly the uniform arm's seed-0 run."""
    directory = tmp_path_factory.mktemp("pipeline")
    spec = write_spec(directory)
    (directory / "output.txt").write_text(run(spec))
    return directory


def test_every_artifact_is_written(finished: Path) -> None:
    run_dir = finished / "run"
    for name in (
        "spec.resolved.toml",
        "plugins.json",
        "env.json",
        "profiles.json",
        "widths.json",
        "report.md",
        "results.json",
        "plots/profiles.png",
        "plots/widths.png",
        "plots/val_loss.png",
        "reference/model.safetensors",
        "clouds/meta.json",
    ):
        assert (run_dir / name).exists(), name
    assert len(list((run_dir / "clouds").glob("layer-*.safetensors"))) == 4
    profiles = json.loads((run_dir / "profiles.json").read_text())["profiles"]
    assert set(profiles) == {"shift/spherical", "gw/hyperbolic"}
    assert all(len(v) == 4 and all(x >= 0 for x in v) for v in profiles.values())
    for arm in ("uniform", "cosine", "shift-spherical", "anti"):
        for seed in (0, 1):
            out = run_dir / "arms" / arm / f"seed-{seed}"
            for name in ("model.safetensors", "metrics.jsonl", "trainer_state.pt", "result.json"):
                assert (out / name).exists(), out / name


def test_equal_budgets_and_report_numbers_match_per_seed_results(finished: Path) -> None:
    run_dir = finished / "run"
    results = json.loads((run_dir / "results.json").read_text())
    widths = json.loads((run_dir / "widths.json").read_text())["arms"]
    assert results["equal_params"]
    assert results["checks"] == dict.fromkeys(results["checks"], True)
    assert len({arm["params"] for arm in results["arms"].values()}) == 1
    for name, arm in results["arms"].items():
        assert sum(arm["widths"]) == 4 * 64 and arm["widths"] == widths[name]["widths"]
        for seed, loss in arm["val_loss"]["seeds"].items():
            per_seed = json.loads(
                (run_dir / "arms" / name / f"seed-{seed}" / "result.json").read_text()
            )
            assert loss == per_seed["final_val_loss"]
        if name != "uniform":
            base = results["arms"]["uniform"]["val_loss"]["seeds"]
            diffs = [arm["val_loss"]["seeds"][s] - base[s] for s in ("0", "1")]
            assert arm["vs_uniform"]["mean"] == pytest.approx(sum(diffs) / 2)
            assert arm["vs_uniform"]["improved"] == sum(d < 0 for d in diffs)
    [pair] = results["comparisons"]  # report.compare, from the spec through run.json
    losses = {
        name: results["arms"][name]["val_loss"]["seeds"] for name in ("shift-spherical", "cosine")
    }
    diffs = [losses["shift-spherical"][s] - losses["cosine"][s] for s in ("0", "1")]
    assert (pair["arm"], pair["against"]) == ("shift-spherical", "cosine")
    assert pair["difference"]["mean"] == pytest.approx(sum(diffs) / 2)
    assert "| shift-spherical | cosine |" in (run_dir / "report.md").read_text()
    # the anti control inverts its profile: more work, never more width; the layer with the
    # most work is the narrowest and the one with the least the widest
    work, anti = results["profiles"]["gw/hyperbolic"], results["arms"]["anti"]["widths"]
    assert len(set(work)) == 4
    for i, j in itertools.permutations(range(4), 2):
        if work[i] > work[j]:
            assert anti[i] <= anti[j], (work, anti)
    most, least = work.index(max(work)), work.index(min(work))
    assert anti[most] == min(anti) < max(anti) == anti[least]


def test_the_reference_is_reused_as_the_uniform_arms_seed_0_and_equals_a_fresh_run(
    finished: Path, tmp_path: Path
) -> None:
    output = (finished / "output.txt").read_text()
    assert output.count("identical to the reference run: reused") == 1  # seed 0, not seed 1
    copied = finished / "run" / "arms" / "uniform" / "seed-0"
    fresh = tmp_path / "fresh"
    command = ["train", str(finished / "spec.toml"), "--arm", "uniform", "--seed", "0"]
    result = CliRunner().invoke(cli, [*command, "--out", str(fresh)])
    assert result.exit_code == 0, result.output
    assert "identical to the reference run" not in result.output  # trained, not copied
    loss = json.loads((copied / "result.json").read_text())["final_val_loss"]
    assert loss == json.loads((fresh / "result.json").read_text())["final_val_loss"]
    a, b = load_file(copied / "model.safetensors"), load_file(fresh / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _cosine_widths(run_dir: Path) -> list[int]:
    return json.loads((run_dir / "widths.json").read_text())["arms"]["cosine"]["widths"]


def test_until_stops_after_the_stage_it_names(finished: Path, tmp_path: Path) -> None:
    """A copy of the finished run whose cosine arm changes: --until solve writes the new widths
    and trains nothing."""
    shutil.copytree(finished / "run", tmp_path / "run")
    changed = SPEC.replace("start = 1.5, end = 0.5", "start = 1.75, end = 0.25")
    spec = write_spec(tmp_path, changed)
    results = tmp_path / "run" / "results.json"
    stamps = {p: p.stat().st_mtime_ns for p in [results, *(tmp_path / "run").rglob("result.json")]}
    output = run(spec, "--until", "solve")
    assert "train [" not in output
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps
    widths = _cosine_widths(tmp_path / "run")
    assert widths != _cosine_widths(finished / "run")  # the new taper, from the solve stage
    expected = CliRunner().invoke(cli, ["widths", str(spec), "--json"])
    assert widths == json.loads(expected.stdout)["arms"]["cosine"]["widths"]


def test_from_redoes_the_stage_it_names_and_the_later_ones(finished: Path) -> None:
    run_dir = finished / "run"
    trained = {p: p.stat().st_mtime_ns for p in (run_dir / "arms").rglob("result.json")}
    report = (run_dir / "results.json").stat().st_mtime_ns
    output = run(finished / "spec.toml", "--from", "report")
    assert "nothing to do" not in output and "train [" not in output
    assert {p: p.stat().st_mtime_ns for p in trained} == trained
    assert (run_dir / "results.json").stat().st_mtime_ns != report
    assert "nothing to do" in run(finished / "spec.toml")


def test_second_run_does_nothing_and_one_changed_arm_retrains_alone(finished: Path) -> None:
    spec = finished / "spec.toml"
    assert "nothing to do" in run(spec)
    stamps = {p: p.stat().st_mtime_ns for p in (finished / "run" / "arms").rglob("result.json")}
    # how a run is carried out (threads, checkpoint and log intervals) is not what it computes
    bookkeeping = spec.read_text().replace("threads = 1", "threads = 2")
    bookkeeping = bookkeeping.replace("checkpoint_interval = 5", "checkpoint_interval = 7")
    spec.write_text(bookkeeping.replace("warmup = 5", "warmup = 5\nlog_interval = 3"))
    assert "nothing to do" in run(spec)
    changed_arms = spec.read_text().replace("start = 1.5, end = 0.5", "start = 1.25, end = 0.75")
    spec.write_text(changed_arms.replace('"gw/hyperbolic" }', '"shift/spherical" }'))
    output = run(spec)
    trained = [line.split(": ", 1)[1] for line in output.splitlines() if "train [" in line]
    # seed-major: a study stopped part-way has every arm for the seeds it finished
    assert trained == [
        "arm cosine, seed 0", "arm anti, seed 0", "arm cosine, seed 1", "arm anti, seed 1"
    ]  # fmt: skip
    assert "reference: training" not in output
    changed = {p for p, t in stamps.items() if p.stat().st_mtime_ns != t}
    assert changed == {p for p in stamps if p.parts[-3] in ("cosine", "anti")}


def _losses(run_dir: Path) -> dict[str, dict[str, float]]:
    results = json.loads((run_dir / "results.json").read_text())
    return {name: arm["val_loss"]["seeds"] for name, arm in results["arms"].items()}


def _start(spec: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "geospec", "run", str(spec)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _kill_when(process: subprocess.Popen[bytes], path: Path) -> None:
    deadline = time.monotonic() + 300
    while not path.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)  # no chance to clean up: mid-step, mid-write
    process.wait()


def test_killed_run_resumes_to_the_same_results(finished: Path, tmp_path: Path) -> None:
    spec = write_spec(tmp_path)
    run_dir = tmp_path / "run"
    # killed while training the reference, then while training an arm
    _kill_when(_start(spec), run_dir / "reference" / "trainer_state.pt")
    reference_dir = (run_dir / "reference").stat().st_ino
    _kill_when(_start(spec), run_dir / "arms" / "uniform" / "seed-1" / "trainer_state.pt")
    assert not (run_dir / "results.json").exists()
    run(spec)
    assert (run_dir / "reference").stat().st_ino == reference_dir  # resumed, not started over
    reference = _losses(finished / "run")
    resumed = _losses(run_dir)
    for arm in ("uniform", "shift-spherical"):  # the arms the second-run test left unchanged
        for seed in ("0", "1"):
            assert resumed[arm][seed] == pytest.approx(reference[arm][seed], abs=1e-6)


SMALL = """
name = "torchrun-test"
measure = []

[model]
n_layers = 3
d_model = 32
n_heads = 2
ffn_width = 64
seq_len = 32
multiple_of = 8

[data]
tokenizer = { kind = "bpe", vocab_size = 300 }
max_documents = 200

[probe]
tokens = 32

[[arms]]
name = "uniform"
schedule = { kind = "uniform" }

[[arms]]
name = "cosine"
schedule = { kind = "cosine" }

[train]
steps = 12
batch_size = 8
seeds = [0, 1]
eval_tokens = 2048
"""


def test_torchrun_two_processes_match_one(tmp_path: Path) -> None:
    """Under torchrun every run is trained with DDP across processes; results equal one process."""
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    one, two = write_spec(tmp_path / "one", SMALL), write_spec(tmp_path / "two", SMALL)
    run(one)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "-m",
            "geospec",
            "run",
            str(two),
        ],
        env=env,
        check=True,
        capture_output=True,
        timeout=600,
    )
    single, double = _losses(tmp_path / "one" / "run"), _losses(tmp_path / "two" / "run")
    for arm in ("uniform", "cosine"):
        for seed in ("0", "1"):
            assert double[arm][seed] == pytest.approx(single[arm][seed], abs=1e-5)


#: SMALL measuring one topology profile on 1,024 probed positions: the ranks measure their
#: shares of the layers for a while (ripser per layer), then gather them.
MEASURED = (
    SMALL.replace("measure = []\n", "").replace("[probe]\ntokens = 32", "[probe]\ntokens = 1024")
    + '\n[[measure]]\ngeometry = { kind = "raw" }\nstatistic = { kind = "topology" }\n'
)


def _torchrun_run(spec: Path) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
        "-m", "geospec", "run", str(spec),
    ]  # fmt: skip


@pytest.mark.slow
def test_torchrun_workers_whose_launcher_is_killed_during_measure_end_at_once(
    tmp_path: Path,
) -> None:
    """torchrun killed outright (SIGKILL: it forwards nothing) while the ranks measure (one may
    wait for the other's share): both workers end within seconds (each watches its parent),
    not when the measurement is done; nothing they left keeps a new torchrun from finishing; the
    profile both ranks measured has every layer."""
    spec = write_spec(tmp_path, MEASURED)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    launcher = subprocess.Popen(
        _torchrun_run(spec),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    stages = tmp_path / "run" / "stages.json"
    deadline = time.monotonic() + 300
    while "probe" not in (stages.read_text() if stages.exists() else ""):
        assert launcher.poll() is None, "torchrun ended before the measure stage"
        assert time.monotonic() < deadline
        time.sleep(0.05)
    workers = process_tree(launcher.pid)[1:]
    assert len(workers) >= 2  # the two ranks (rank 0 may have measurement workers too)
    os.kill(launcher.pid, signal.SIGKILL)
    launcher.wait()
    killed = time.monotonic()
    while any(alive(pid) for pid in workers):
        assert time.monotonic() - killed < 15, "workers still running after their launcher died"
        time.sleep(0.1)
    assert not (tmp_path / "run" / "profiles.json").exists()  # cut short, not finished
    subprocess.run(_torchrun_run(spec), env=env, check=True, capture_output=True, timeout=600)
    assert set(_losses(tmp_path / "run")) == {"uniform", "cosine"}
    profile = json.loads((tmp_path / "run" / "profiles.json").read_text())["profiles"]
    assert len(profile["topology/raw"]) == 3


def test_runs_claimed_by_another_process_are_left_to_it(tmp_path: Path) -> None:
    """`geospec run` processes may share a run directory: none trains what another holds."""
    spec = write_spec(tmp_path, SMALL)
    run_dir = tmp_path / "run"
    held = run_dir / "arms" / "cosine" / "seed-0"
    held.parent.mkdir(parents=True)
    (run_dir / "run.json").write_text("{}")  # the other `geospec run` made the run directory
    with claim(held) as granted:  # this test process plays the other `geospec run`
        assert granted
        output = run(spec)
    assert "arm cosine, seed 0: another process is training it (skipped)" in output
    assert "arm cosine, seed 1" in output and "arm uniform, seed 1" in output
    assert not (held / "result.json").exists()
    assert set(_losses(run_dir)["cosine"]) == {"1"}  # the report leaves the held run out
    assert "train" not in json.loads((run_dir / "stages.json").read_text())
    output = run(spec)  # the other process is gone: only the run it held is left to train
    trained = [line.split(": ", 1)[1] for line in output.splitlines() if "train [" in line]
    assert trained == ["arm cosine, seed 0"]
    assert set(_losses(run_dir)["cosine"]) == {"0", "1"}
    assert "nothing to do" in run(spec)


@pytest.mark.slow
def test_torchrun_ranks_that_loaded_different_specs_stop_with_one_line(tmp_path: Path) -> None:
    """Rank 1 started with another --set value: every rank stops before any stage (exit 2)."""
    spec = write_spec(tmp_path, SMALL)
    script = tmp_path / "ranks.py"
    script.write_text(
        "import os, sys\n"
        "from geospec.cli import main\n"
        f"sys.argv = ['geospec', 'run', {str(spec)!r}]\n"
        "if os.environ['RANK'] == '1':\n"
        "    sys.argv += ['--set', 'train.lr=0.001']\n"
        "main()\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    done = subprocess.run(
        [*command, "--nproc_per_node", "2", str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if "loaded different specs" in line]
    assert len(lines) == 2, done.stderr[-3000:]  # one line from each rank
    assert all("rank 1's is not rank 0's" in line for line in lines)
    assert not (tmp_path / "run" / "stages.json").exists()
