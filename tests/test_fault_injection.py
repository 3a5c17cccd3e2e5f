"""Fault injection: every kind of artifact of a finished run directory, damaged as a careless or
hostile user would (cut short, garbage bytes, the wrong JSON type, deleted, its content changed
with its key intact), and the documented outcome for each (docs/pipeline.md, "Damaged
artifacts"): geospec recomputes it and ends with the same results, or stops with one line naming
the file (exit status 2). Never a traceback, never a report that differs from an undamaged run's.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from geospec.cli import cli

pytestmark = pytest.mark.torch

CORPUS = Path(__file__).parent / "fixtures" / "legacy-run" / "corpus.txt"
SPEC = """
name = "faults"
out = "{out}"

[model]
n_layers = 3
d_model = 16
n_heads = 2
ffn_width = 32
seq_len = 16
multiple_of = 8

[data]
files = ["corpus.txt"]
tokenizer = { kind = "bpe", vocab_size = 300 }

[probe]
tokens = 32

[[measure]]
geometry = { kind = "spherical" }
statistic = { kind = "shift" }

[diagnose]
enabled = true
windows = 2
pairs = 2

[demand]
enabled = true
keep = [0.75, 0.5]
windows = 2
pairs = 2

[[arms]]
name = "uniform"
schedule = { kind = "uniform" }

[[arms]]
name = "cosine"
schedule = { kind = "cosine", start = 1.5, end = 0.5 }

[[arms]]
name = "shift-spherical"
schedule = { kind = "geometric", profile = "shift/spherical", solver = { kind = "power_law" } }

[[arms]]
name = "calibrated"
schedule = { kind = "calibrated" }

[train]
steps = 4
batch_size = 4
seeds = [0]
eval_tokens = 256
checkpoint_interval = 2
threads = 1

[report]
plots = false
"""


def write_spec(folder: Path, text: str = SPEC, out: str | None = None) -> Path:
    """The spec in ``folder``, its run directory ``folder/run`` unless ``out`` says otherwise."""
    path = folder / "spec.toml"
    path.write_text(text.replace("{out}", out if out is not None else str(folder / "run")))
    return path


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


@pytest.fixture(scope="module")
def token_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A token cache of this module's own, so damaging it touches no other test."""
    cache = tmp_path_factory.mktemp("token-cache")
    before = os.environ.get("GEOSPEC_CACHE")
    os.environ["GEOSPEC_CACHE"] = str(cache)
    yield cache
    if before is None:
        del os.environ["GEOSPEC_CACHE"]
    else:
        os.environ["GEOSPEC_CACHE"] = before


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory, token_cache: Path) -> Path:
    """A finished run directory (beside its spec and corpus), made once."""
    folder = tmp_path_factory.mktemp("finished")
    write_spec(folder)
    shutil.copy(CORPUS, folder / "corpus.txt")
    result = invoke("run", str(folder / "spec.toml"))
    assert result.exit_code == 0, result.output
    return folder


@pytest.fixture
def copy(finished: Path, tmp_path: Path) -> Path:
    shutil.copytree(finished, tmp_path / "copy")
    write_spec(tmp_path / "copy")
    return tmp_path / "copy"


def results_of(run_dir: Path) -> dict[str, Any]:
    """What a report claims: per arm its widths, parameters and losses, the checks and notes."""
    results = json.loads((run_dir / "results.json").read_text())
    arms = {
        name: (arm["widths"], arm["bounds"], arm["params"], arm["val_loss"]["seeds"])
        for name, arm in results["arms"].items()
    }
    return {
        "arms": arms,
        "checks": results["checks"],
        "profiles": results["profiles"],
        "notes": results["notes"],
    }


# -- how to damage a file ------------------------------------------------------------------------


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: max(1, path.stat().st_size // 2)])


def garbage(path: Path) -> None:
    path.write_bytes(random.Random(0).randbytes(max(64, path.stat().st_size)))


def wrong_type(path: Path) -> None:
    path.write_text("[]")


def delete(path: Path) -> None:
    path.unlink()


def zero_data(path: Path) -> None:
    """Zero a safetensors file's tensors, keeping its header intact (it still loads)."""
    raw = bytearray(path.read_bytes())
    header = 8 + int.from_bytes(raw[:8], "little")
    raw[header:] = bytes(len(raw) - header)
    path.write_bytes(bytes(raw))


def edit_json(change: Callable[[Any], None]) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        data = json.loads(path.read_text())
        change(data)
        path.write_text(json.dumps(data))

    return damage


def _scale_first_profile(data: Any) -> None:
    data["profiles"]["shift/spherical"][0] *= 3.0


def _change_widths(data: Any) -> None:
    data["arms"]["shift-spherical"]["widths"] = [48, 32, 16]


def _change_bounds(data: Any) -> None:
    data["arms"]["shift-spherical"]["bounds"] = [8, 16]


def _change_seal(data: Any) -> None:
    data["digest"] = "blake2b:" + "0" * 32


def _drop_seal_and_change_bounds(data: Any) -> None:
    """Made to pass for a widths.json from before seals (which is judged on its widths only)."""
    del data["digest"]
    _change_bounds(data)


def _change_diagnostics(data: Any) -> None:
    data["profiles"]["residual_norm/mean"][0] += 1.0


def _change_demand(data: Any) -> None:
    data["orders"][0].reverse()  # another neuron ordering, every profile left as it was


def _garble_execution(data: Any) -> None:
    data["execution"] = [["cpu"], 7]  # how the run computed: informational, never trusted


def _change_loss(data: Any) -> None:
    data["arms"]["cosine"]["val_loss"]["seeds"]["0"] -= 0.5


ARM = "run/arms/cosine/seed-0"
#: (file in the copied folder, damage, what geospec says) -> geospec run recomputes what it must
#: (and says so) and ends with the same results.
RECOMPUTED = {
    "stages.json truncated": ("run/stages.json", truncate, "probe:"),
    "stages.json a list": ("run/stages.json", wrong_type, "probe:"),
    "stages.json garbage": ("run/stages.json", garbage, "probe:"),
    "run.json a list": ("run/run.json", wrong_type, "nothing to do"),
    "run_key.json of an arm truncated": (f"{ARM}/run_key.json", truncate, "arm cosine, seed 0"),
    "run_key.json of the reference garbage": ("run/reference/run_key.json", garbage, "✓ probe"),
    "reference weights zeroed, header intact": (
        "run/reference/model.safetensors",
        zero_data,
        "! reference: model.safetensors changed after training",
    ),
    "reference weights truncated": (
        "run/reference/model.safetensors",
        truncate,
        "! reference: model.safetensors changed after training",
    ),
    "reference result.json a list": (
        "run/reference/result.json",
        wrong_type,
        "! reference: result.json does not hold what geospec wrote",
    ),
    "profiles.json truncated": ("run/profiles.json", truncate, "! measure: profiles.json is"),
    "profiles.json a list": ("run/profiles.json", wrong_type, "! measure: profiles.json does"),
    "profiles.json edited, key intact": (
        "run/profiles.json",
        edit_json(_scale_first_profile),
        "! measure: profiles.json was changed after geospec wrote it",
    ),
    "a cloud deleted": (
        "run/clouds/layer-001.safetensors",
        delete,
        "holds 2 layer files, meta.json says 3",
    ),
    "a cloud truncated": ("run/clouds/layer-001.safetensors", truncate, "is unreadable"),
    "a cloud zeroed, header intact": (
        "run/clouds/layer-001.safetensors",
        zero_data,
        "layer-001.safetensors changed after it was probed",
    ),
    "clouds/meta.json garbage": ("run/clouds/meta.json", garbage, "meta.json is unreadable"),
    "widths.json truncated": ("run/widths.json", truncate, "! solve: widths.json does not hold"),
    "widths.json edited": (
        "run/widths.json",
        edit_json(_change_widths),
        "! solve: widths.json does not hold",
    ),
    "widths.json bounds edited": (
        "run/widths.json",
        edit_json(_change_bounds),
        "! solve: widths.json does not hold",
    ),
    "widths.json seal edited": (
        "run/widths.json",
        edit_json(_change_seal),
        "! solve: widths.json was changed after geospec wrote it",
    ),
    "widths.json bounds edited, digest removed": (
        "run/widths.json",
        edit_json(_drop_seal_and_change_bounds),
        "! solve: widths.json does not hold",
    ),
    "diagnostics.json truncated": ("run/diagnostics.json", truncate, "! diagnose: diagnostics"),
    "diagnostics.json edited": (
        "run/diagnostics.json",
        edit_json(_change_diagnostics),
        "! diagnose: diagnostics.json was changed",
    ),
    "demand.json truncated": ("run/demand.json", truncate, "! demand: demand.json is"),
    "demand.json a list": ("run/demand.json", wrong_type, "! demand: demand.json does not hold"),
    "demand.json edited": (
        "run/demand.json",
        edit_json(_change_demand),
        "! demand: demand.json was changed after geospec wrote it",
    ),
    "results.json truncated": ("run/results.json", truncate, "! report: results.json is"),
    "results.json edited": (
        "run/results.json",
        edit_json(_change_loss),
        "! report: results.json was changed",
    ),
    "result.json of an arm truncated": (f"{ARM}/result.json", truncate, "arm cosine, seed 0"),
    "result.json of an arm a list": (f"{ARM}/result.json", wrong_type, "arm cosine, seed 0"),
    "metrics.jsonl garbage": (f"{ARM}/metrics.jsonl", garbage, "nothing to do"),
    "result.json of an arm: execution garbled": (
        f"{ARM}/result.json",
        edit_json(_garble_execution),
        "nothing to do",
    ),
}


@pytest.mark.parametrize("case", list(RECOMPUTED))
def test_damaged_artifacts_are_recomputed_to_the_same_results(
    finished: Path, copy: Path, case: str
) -> None:
    name, damage, said = RECOMPUTED[case]
    damage(copy / name)
    result = invoke("run", str(copy / "spec.toml"))
    assert result.exit_code == 0, result.output
    assert result.exception is None and "Traceback" not in result.output
    assert said in result.output
    assert results_of(copy / "run") == results_of(finished / "run")


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param({"trainer_state.pt": truncate}, id="checkpoint state truncated"),
        pytest.param({"trainer_state.pt": garbage}, id="checkpoint state garbage"),
        pytest.param({"model.safetensors": zero_data}, id="checkpoint weights zeroed"),
        pytest.param({"model.safetensors": truncate}, id="checkpoint weights truncated"),
    ],
)
def test_an_interrupted_run_with_a_damaged_checkpoint_starts_over(
    finished: Path, copy: Path, damage: dict[str, Callable[[Path], None]]
) -> None:
    """A run interrupted after a checkpoint (no result.json yet) whose checkpoint was damaged:
    resuming from it would be wrong, so the run trains from the start (and says so)."""
    arm = copy / ARM
    (arm / "result.json").unlink()
    for name, change in damage.items():
        change(arm / name)
    result = invoke("run", str(copy / "spec.toml"))
    assert result.exit_code == 0, result.output
    assert "arm cosine, seed 0" in result.output and "from the start" in result.output
    assert results_of(copy / "run") == results_of(finished / "run")


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(("val.bin", "shuffle"), id="val.bin shuffled"),
        pytest.param(("train.bin", "cut"), id="train.bin cut in half"),
        pytest.param(("val.bin", "delete"), id="val.bin deleted"),
        pytest.param(("meta.json", "cut"), id="meta.json truncated"),
    ],
)
def test_a_damaged_token_cache_is_rebuilt_before_training_on_it(
    finished: Path, copy: Path, token_cache: Path, damage: tuple[str, str]
) -> None:
    name, how = damage
    [cache] = {path.parent for path in token_cache.rglob("meta.json")}
    path = cache / name
    if how == "shuffle":
        values = bytearray(path.read_bytes())
        random.Random(1).shuffle(values)
        path.write_bytes(bytes(values))
    elif how == "cut":
        truncate(path)
    else:
        delete(path)
    result = invoke("run", str(copy / "spec.toml"), "--from", "train")
    assert result.exit_code == 0, result.output
    assert "preparing the tokens again" in result.output
    assert results_of(copy / "run") == results_of(finished / "run")


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(("progress.json", truncate), id="progress.json truncated"),
        pytest.param(("progress.json", garbage), id="progress.json garbage"),
        pytest.param(("progress.json", wrong_type), id="progress.json wrong type"),
        pytest.param(("train.bin", truncate), id="train.bin shorter than recorded"),
        pytest.param(("tokenizer.json", delete), id="tokenizer.json deleted"),
    ],
)
def test_a_damaged_partial_token_cache_is_prepared_again_to_the_same_tokens(
    tmp_path: Path, damage: tuple[str, Callable[[Path], None]]
) -> None:
    """An unfinished build (geospec prepare killed) whose record or files are damaged: the next
    prepare starts it over and ends with the tokens of an undisturbed build."""
    from geospec.engine import token_data
    from geospec.spec.sections import DataSpec

    data = DataSpec(files=[str(CORPUS)], tokenizer={"kind": "gpt2"}, val_fraction=0.1)
    clean = token_data.prepare_data(data, tmp_path / "clean")
    work = token_data.partial_dir(tmp_path / "damaged", clean.key)
    shutil.copytree(clean.directory, work)  # a build that got to its last batch, unrenamed
    (work / "meta.json").unlink()
    sizes = {n: (work / f"{n}.bin").stat().st_size for n in token_data.SPLITS}
    state = {"key": clean.key, "eot": clean.eot_id, "batches": 1, "bytes": sizes}
    state |= {"documents": clean.meta["documents"], "tokens": clean.meta["tokens"]}
    (work / token_data.STATE_FILE).write_text(json.dumps(state))
    name, how = damage
    how(work / name)
    again = token_data.prepare_data(data, tmp_path / "damaged")
    assert not work.exists()
    for split in ("train.bin", "val.bin", "tokenizer.json"):
        assert (again.directory / split).read_bytes() == (clean.directory / split).read_bytes()
    assert again.meta == clean.meta


#: The finished run's spec evaluating its arms (the eval extra; nox -s eval).
EVAL_SPEC = SPEC + '\n[eval]\ntasks = ["geospec_austen_lastword"]\nlimit = 6\n'


@pytest.fixture(scope="module")
def evaluated(finished: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The finished run with every arm x seed evaluated, made once."""
    pytest.importorskip("lm_eval")
    folder = tmp_path_factory.mktemp("evaluated") / "run-folder"
    shutil.copytree(finished, folder)
    result = invoke("run", str(write_spec(folder, EVAL_SPEC)))
    assert result.exit_code == 0, result.output
    return folder


def scores_of(run_dir: Path) -> dict[str, Any]:
    """What a report claims of the downstream scores: every arm's per-seed values."""
    results = json.loads((run_dir / "results.json").read_text())
    return {name: arm["eval"] for name, arm in results["arms"].items()}


def _change_score(data: Any) -> None:
    data["tasks"]["geospec_austen_lastword"]["metrics"]["acc"] += 0.5


@pytest.mark.eval
@pytest.mark.parametrize(
    "damage, said",
    [
        pytest.param(truncate, "eval.json is unreadable", id="truncated"),
        pytest.param(wrong_type, "eval.json does not hold what geospec wrote", id="a list"),
        pytest.param(
            edit_json(_change_score), "eval.json was changed after geospec wrote it", id="edited"
        ),
        pytest.param(delete, "eval: arm cosine, seed 0", id="deleted"),
    ],
)
def test_a_damaged_eval_json_is_evaluated_again(
    evaluated: Path, tmp_path: Path, damage: Callable[[Path], None], said: str
) -> None:
    shutil.copytree(evaluated, tmp_path / "copy")
    spec = write_spec(tmp_path / "copy", EVAL_SPEC)
    damage(tmp_path / "copy" / ARM / "eval.json")
    result = invoke("run", str(spec))
    assert result.exit_code == 0, result.output
    assert result.exception is None and "Traceback" not in result.output
    assert said in result.output
    assert "arm uniform, seed 0" not in result.output  # only the damaged run is evaluated
    assert scores_of(tmp_path / "copy" / "run") == scores_of(evaluated / "run")
    assert results_of(tmp_path / "copy" / "run") == results_of(evaluated / "run")


def test_a_damaged_run_json_stops_geospec_report_with_one_line(copy: Path) -> None:
    (copy / "run" / "run.json").write_text("[]")
    result = invoke("report", str(copy / "run"))
    assert result.exit_code == 2
    assert "run.json" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        pytest.param(truncate, "widths.json is unreadable", id="cut"),
        pytest.param(edit_json(_change_widths), "changed after geospec wrote it", id="edited"),
    ],
)
def test_geospec_train_names_a_damaged_widths_json(
    copy: Path, damage: Callable[[Path], None], said: str
) -> None:
    """`geospec train` trains an arm with widths.json's widths: never with edited ones."""
    damage(copy / "run" / "widths.json")
    result = invoke("train", str(copy / "spec.toml"), "--arm", "shift-spherical", "--seed", "1")
    assert result.exit_code == 2
    assert said in result.output and "Traceback" not in result.output
    assert not (copy / "run" / "arms" / "shift-spherical" / "seed-1").exists()


def test_geospec_report_names_an_edited_widths_json(copy: Path) -> None:
    """The report marks layers at their schedule's bounds from widths.json: an edited one stops
    it with one line rather than marking the wrong layers."""
    edit_json(_change_bounds)(copy / "run" / "widths.json")
    result = invoke("report", str(copy / "run"))
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "widths.json was changed after geospec wrote it" in result.output


def test_the_report_holds_each_arms_bounds(finished: Path) -> None:
    """The power-law solver's default bounds, 0.25 and 2 times the uniform width 32 (multiples
    of 8); a fixed taper and the uniform schedule set none."""
    arms = json.loads((finished / "run" / "results.json").read_text())["arms"]
    assert arms["shift-spherical"]["bounds"] == [8, 64]
    assert arms["uniform"]["bounds"] is None and arms["cosine"]["bounds"] is None


# -- the run directory itself --------------------------------------------------------------------


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    write_spec(tmp_path)
    shutil.copy(CORPUS, tmp_path / "corpus.txt")
    return tmp_path


@pytest.mark.parametrize(
    ("out", "message"),
    [
        ("/", "root or home"),
        ("~", "root or home"),
        ("corpus.txt", "is a file"),
        ("corpus.txt/run", "cannot be written"),
        ("/proc/geospec-run", "cannot be written"),
        (".", "did not make"),
    ],
)
def test_an_unusable_out_is_refused_with_one_line(folder: Path, out: str, message: str) -> None:
    spec = write_spec(folder, out=out if out.startswith(("/", "~")) else str(folder / out))
    before = sorted(p.name for p in folder.iterdir())
    result = invoke("run", str(spec))
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert sorted(p.name for p in folder.iterdir()) == before


def test_out_with_dot_dot_is_shown_resolved(folder: Path) -> None:
    (folder / "sub").mkdir()
    (folder / "mine.txt").write_text("the user's")
    spec = write_spec(folder, out=str(folder / "sub" / ".."))
    result = invoke("run", str(spec))
    assert result.exit_code == 2
    assert f"(that is {folder.resolve()})" in result.output


def test_files_the_user_put_in_a_run_directory_survive_a_redo(copy: Path) -> None:
    """geospec deletes only what it wrote: a note beside the clouds or in a training directory
    stays when those are made again."""
    notes = [copy / "run" / "clouds" / "keep.txt", copy / "run" / "reference" / "notes.txt"]
    for note in notes:
        note.write_text("mine")
    result = invoke("run", str(copy / "spec.toml"), "--from", "reference")
    assert result.exit_code == 0, result.output
    assert all(note.read_text() == "mine" for note in notes)


def test_seeds_outside_what_torch_accepts_are_refused(folder: Path) -> None:
    for seeds in ("[-1]", "[4294967296]"):
        spec = write_spec(folder, SPEC.replace("seeds = [0]", f"seeds = {seeds}"))
        result = invoke("validate", str(spec))
        assert result.exit_code == 2 and "train.seeds[0]" in result.output, result.output
    spec = write_spec(folder)
    result = invoke("train", str(spec), "--arm", "uniform", "--seed", "-1")
    assert result.exit_code == 2 and "--seed" in result.output
    assert not (folder / "run").exists()


def test_artifacts_are_written_with_the_umask(copy: Path, finished: Path) -> None:
    mode = (finished / "run" / "results.json").stat().st_mode & 0o777
    assert mode == 0o666 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "split is empty (empty.txt gave 0 training"),
        (bytes(range(256)) * 8, "is not UTF-8 text"),
        ("café au lait\n\nsecond\n".encode("latin-1"), "is not UTF-8 text"),
    ],
)
def test_data_files_that_are_empty_or_not_text_are_one_line(
    folder: Path, content: bytes, message: str
) -> None:
    (folder / "empty.txt").write_bytes(content)
    spec = write_spec(folder, SPEC.replace('"corpus.txt"', '"empty.txt"'))
    result = invoke("run", str(spec), "--until", "reference")
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output


def _drop_a_measure(data: Any) -> None:
    data["measure"].pop()


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        (truncate, "measures.json is unreadable"),
        (wrong_type, "measures.json does not hold what geospec wrote"),
        (edit_json(_drop_a_measure), "measures.json was changed after geospec wrote it"),
    ],
    ids=["truncated", "a list", "a measure dropped, seal intact"],
)
def test_a_damaged_measures_json_is_said_and_measure_all_resolved_again(
    tmp_path: Path, damage: Callable[[Path], None], said: str
) -> None:
    from geospec.pipeline.run_dir import pin_measures
    from geospec.rundir.layout import MEASURES_FILE
    from geospec.spec.loading import validate_spec
    from geospec.testing import minimal_spec

    spec = validate_spec(minimal_spec(measure="all"))
    first = pin_measures(spec, tmp_path, print)
    damage(tmp_path / MEASURES_FILE)
    lines: list[str] = []
    again = pin_measures(spec, tmp_path, lines.append)
    assert [said in line and "resolved again" in line for line in lines] == [True]
    assert again.measure == first.measure  # what every plugin registered now gives
    assert pin_measures(spec, tmp_path, lines.append).measure == first.measure and len(lines) == 1


# -- what a recommended pruned model ships as ----------------------------------------------------


@pytest.fixture(scope="module")
def shipping(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished prune that recommends an arm (prune.select), made once: its keep fraction's
    shipped.json records what the recommended model ships as."""
    from test_prune import invoke as prune
    from test_prune import prune_spec

    folder = tmp_path_factory.mktemp("shipping")
    arms = [{"name": "uniform", "schedule": {"kind": "uniform"}},
            {"name": "flap", "schedule": {"kind": "flap"}}]  # fmt: skip
    spec = prune_spec(folder, keep=0.5, arms=arms, select={"windows": 4}, export=False,
                      calibration={"windows": 8, "seeds": [0]})  # fmt: skip
    prune("prune", str(spec))
    return folder


def _change_bytes(data: Any) -> None:
    data["safetensors_bytes"] += 1


def _change_bytes_and_seal(data: Any) -> None:
    from geospec.storage.digests import sealed

    _change_bytes(data)
    data.update(sealed(data))


def _change_score(data: Any) -> None:
    data["score"] = {"windows": 4, "float32": 3.0, "shipped": 3.0, "difference": 0.0}


def _drop_score_and_seal(data: Any) -> None:
    from geospec.storage.digests import sealed

    del data["score"]
    data.update(sealed(data))


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        pytest.param(truncate, "shipped.json is unreadable", id="truncated"),
        pytest.param(wrong_type, "shipped.json does not hold what geospec wrote", id="a list"),
        pytest.param(delete, "shipped.json is missing", id="deleted"),
        pytest.param(
            edit_json(_change_bytes), "shipped.json was changed after geospec wrote it",
            id="edited, seal intact",
        ),
        pytest.param(
            edit_json(_change_bytes_and_seal), "shipped.json does not hold what prune.json "
            "records", id="edited and sealed again",
        ),
        pytest.param(
            edit_json(_change_score), "shipped.json was changed after geospec wrote it",
            id="score edited, seal intact",
        ),
        pytest.param(
            edit_json(_drop_score_and_seal), "shipped.json does not hold what prune.json "
            "records", id="score dropped and sealed again",
        ),
    ],
)  # fmt: skip
def test_a_damaged_shipped_json_is_measured_again(
    shipping: Path, damage: Callable[[Path], None], said: str
) -> None:
    """The prune stage checks each recommended model's shipped.json against prune.json before it
    calls itself up to date: a damaged or edited one is named, measured again (no unit is
    computed again) and prune.json ends as it was."""
    run = shipping / "run"
    before = (run / "prune.json").read_text()
    unit = next((run / "prune").glob("keep-0.5/*/seed-0/result.json"))
    stamp = unit.stat().st_mtime_ns
    damage(run / "prune" / "keep-0.5" / "shipped.json")
    result = invoke("prune", str(shipping / "spec.toml"))
    assert result.exit_code == 0, result.output
    assert f"! prune: prune/keep-0.5/{said}; running it again" in result.output
    assert "measuring what the recommended" in result.output and "Traceback" not in result.output
    assert json.loads((run / "prune.json").read_text()) == json.loads(before)
    assert unit.stat().st_mtime_ns == stamp
    assert "prune: up to date" in invoke("prune", str(shipping / "spec.toml")).output


def _another_units_cut(path: Path) -> None:
    """Another unit's cut.safetensors in its place: whole and sealed, but not its own."""
    other = next(p for p in path.parents[2].glob("*/seed-0/cut.safetensors") if p != path)
    path.write_bytes(other.read_bytes())


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        pytest.param(truncate, "cut.safetensors cannot be read", id="truncated"),
        pytest.param(garbage, "cut.safetensors cannot be read", id="garbage"),
        pytest.param(
            zero_data, "cut.safetensors's neuron orders changed after geospec wrote them",
            id="orders zeroed, header intact",
        ),
        pytest.param(
            _another_units_cut, "cut.safetensors was written for another computation",
            id="another unit's",
        ),
    ],
)  # fmt: skip
def test_a_damaged_cut_record_is_named_and_its_orders_scored_again(
    shipping: Path, damage: Callable[[Path], None], said: str
) -> None:
    """A unit's cut.safetensors (its neuron orders, which What to ship writes the recommended
    model from) is read back only whole and its own: a damaged one is named, the calibration
    sample is scored again, What to ship ends with the same record and the file is written
    again (the next run is up to date and says nothing of it)."""
    run = shipping / "run"
    before = json.loads((run / "prune.json").read_text())
    arm = before["budgets"][0]["recommended"]["arm"]
    damage(run / "prune" / "keep-0.5" / arm / "seed-0" / "cut.safetensors")
    (run / "prune" / "keep-0.5" / "shipped.json").unlink()
    result = invoke("prune", str(shipping / "spec.toml"))
    assert result.exit_code == 0, result.output
    output = " ".join(result.output.split())
    assert said in output and "the unit's neuron orders are computed again" in output
    assert "Traceback" not in output
    assert json.loads((run / "prune.json").read_text()) == before
    again = invoke("prune", str(shipping / "spec.toml")).output
    assert "prune: up to date" in again and "cut.safetensors" not in again
