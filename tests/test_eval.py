"""geospec eval end to end (the eval extra; nox -s eval): a reduced tiny spec's arms x seeds
scored by lm-evaluation-harness on the bundled offline task and on a task of the spec's own
folder, through their exported checkpoints; each score checked against the model's own
log-likelihoods computed here with transformers, and the report's paired comparisons against
scipy and an enumeration on the per-seed scores read back from the runs' eval.json files."""

from __future__ import annotations

import itertools
import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from geospec.cli import cli

pytestmark = [pytest.mark.eval, pytest.mark.torch]
pytest.importorskip("lm_eval")

TASK = "geospec_austen_lastword"
OWN_TASK = "my_lastword"
ARMS = ("uniform", "cosine")
SEEDS = (0, 1, 2)
LIMIT = 12
SPEC = """
name = "eval"
out = "{out}"

[model]
n_layers = 2
d_model = 32
n_heads = 4
ffn_width = 48
seq_len = 48
multiple_of = 8

[data]
source = "bundled:austen"
max_documents = 120
tokenizer = {{ kind = "bpe", vocab_size = 400 }}

[probe]
tokens = 32

[[measure]]
geometry = {{ kind = "spherical" }}
statistic = {{ kind = "shift" }}

[[arms]]
name = "uniform"
schedule = {{ kind = "uniform" }}

[[arms]]
name = "cosine"
schedule = {{ kind = "cosine", start = 1.5, end = 0.5 }}

[train]
steps = 12
batch_size = 8
lr = 3e-3
seeds = [0, 1, 2]
eval_tokens = 1024
threads = 1

[report]
plots = false

[eval]
tasks = ["{task}", "{own}"]
include = ["tasks"]
limit = {limit}
"""
#: A task of the spec's own (eval.include): the bundled examples' first words, read by a loader
#: beside its YAML (lm-eval finds `utils.py` in the YAML's folder).
OWN_YAML = f"""task: {OWN_TASK}
custom_dataset: !function utils.load
output_type: loglikelihood
test_split: test
doc_to_text: "{{{{text.split(' ')[:-1]|join(' ')}}}}"
doc_to_target: "{{{{' '+text.split(' ')[-1]}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""
OWN_LOADER = """import json
from pathlib import Path

import datasets


def load(**_):
    rows = [json.loads(line) for line in (Path(__file__).parent / "data.jsonl").open()]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})
"""


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def write_spec(folder: Path, **changes: Any) -> Path:
    fields = {"out": str(folder / "run"), "task": TASK, "own": OWN_TASK, "limit": LIMIT}
    path = folder / "spec.toml"
    path.write_text(SPEC.format(**(fields | changes)))
    return path


def own_task(folder: Path) -> None:
    from geospec.evaluate.tasks import AUSTEN_LASTWORD_FILE

    tasks = folder / "tasks"
    tasks.mkdir()
    (tasks / "my_lastword.yaml").write_text(OWN_YAML)
    (tasks / "utils.py").write_text(OWN_LOADER)
    rows = [json.loads(line) for line in AUSTEN_LASTWORD_FILE.read_text().splitlines()]
    short = [{"text": " ".join(row["text"].split()[:8])} for row in rows[:LIMIT]]
    (tasks / "data.jsonl").write_text("".join(json.dumps(row) + "\n" for row in short))


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("eval")
    own_task(folder)
    result = invoke("eval", str(write_spec(folder)))
    assert result.exit_code == 0, result.output
    return folder


def scores(run_dir: Path, arm: str, seed: int) -> dict[str, Any]:
    record = json.loads((run_dir / "arms" / arm / f"seed-{seed}" / "eval.json").read_text())
    tasks: dict[str, Any] = record["tasks"]
    return tasks


def last_word_scores(model_dir: Path, texts: list[str]) -> tuple[float, float]:
    """Accuracy and perplexity of each text's last word given the rest, by definition
    (:func:`model_last_word_scores`), on the exported checkpoint in ``model_dir``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    return model_last_word_scores(model, tokenizer, model.config.n_positions, texts)


def model_last_word_scores(
    model: Any, tokenizer: Any, window: int, texts: list[str]
) -> tuple[float, float]:
    """Accuracy and perplexity of each text's last word given the rest, by definition: the
    log-probability of the word's tokens (those of the whole text after the context's), the
    window cut from the left to the model's length, and whether greedy decoding gives them."""
    import torch

    hits, log_likelihoods = [], []
    for text in texts:
        context, word = text.rsplit(" ", 1)
        whole = tokenizer.encode(f"{context} {word}")
        target = whole[len(tokenizer.encode(context)) :]
        inputs = whole[-(window + 1) :][:-1]
        with torch.no_grad():
            logits = model(torch.tensor([inputs])).logits[0, -len(target) :]
        log_probs = torch.log_softmax(logits.double(), dim=-1)
        log_likelihoods.append(float(log_probs[range(len(target)), target].sum()))
        hits.append(log_probs.argmax(dim=-1).tolist() == target)
    return sum(hits) / len(hits), math.exp(-sum(log_likelihoods) / len(log_likelihoods))


def test_scores_are_the_models_own_last_word_likelihoods(evaluated: Path, tmp_path: Path) -> None:
    from geospec.evaluate.tasks import AUSTEN_LASTWORD_FILE

    texts = [json.loads(line)["text"] for line in AUSTEN_LASTWORD_FILE.read_text().splitlines()]
    run = evaluated / "run" / "arms" / "cosine" / "seed-1"
    exported = tmp_path / "hf"
    assert invoke("export", str(run), "--to", str(exported)).exit_code == 0
    accuracy, perplexity = last_word_scores(exported, texts[:LIMIT])
    task = scores(evaluated / "run", "cosine", 1)[TASK]
    assert task["samples"] == LIMIT
    assert task["metrics"]["acc"] == pytest.approx(accuracy, abs=1e-9)
    assert task["metrics"]["perplexity"] == pytest.approx(perplexity, rel=1e-4)
    assert task["higher_is_better"] == {"acc": True, "perplexity": False}
    own = scores(evaluated / "run", "cosine", 1)[OWN_TASK]
    short = [" ".join(text.split()[:8]) for text in texts[:LIMIT]]
    assert own["metrics"]["acc"] == pytest.approx(last_word_scores(exported, short)[0], abs=1e-9)


def test_results_compare_every_metric_with_the_baseline_as_scipy_does(evaluated: Path) -> None:
    from scipy import stats

    results = json.loads((evaluated / "run" / "results.json").read_text())
    assert results["eval"]["tasks"] == [TASK, OWN_TASK]
    metrics = [f"{TASK}/acc", f"{TASK}/perplexity", f"{OWN_TASK}/acc"]
    assert sorted(results["eval"]["metrics"]) == sorted(metrics)
    for label in metrics:
        task, metric = label.split("/")
        per_seed = {
            arm: [scores(evaluated / "run", arm, s)[task]["metrics"][metric] for s in SEEDS]
            for arm in ARMS
        }
        differences = [a - b for a, b in zip(per_seed["cosine"], per_seed["uniform"], strict=True)]
        entry = results["arms"]["cosine"]["eval"][label]
        assert entry["seeds"] == {str(s): v for s, v in zip(SEEDS, per_seed["cosine"], strict=True)}
        assert entry["mean"] == pytest.approx(sum(per_seed["cosine"]) / len(SEEDS))
        vs = entry["vs_uniform"]
        assert vs["n"] == len(SEEDS)
        assert vs["mean"] == pytest.approx(sum(differences) / len(SEEDS), abs=1e-12)
        spread = stats.tstd(differences)
        if spread > 0:
            interval = stats.t.interval(0.95, len(SEEDS) - 1, vs["mean"], stats.sem(differences))
            assert vs["ci95"] == pytest.approx(list(interval))
        else:
            assert vs["ci95"] == pytest.approx([vs["mean"], vs["mean"]])
        flips = [sum(s * d for s, d in zip(signs, differences, strict=True))
                 for signs in itertools.product((1, -1), repeat=len(SEEDS))]  # fmt: skip
        extreme = sum(abs(f) >= abs(sum(differences)) - 1e-9 for f in flips)
        assert vs["p_exact"] == pytest.approx(extreme / len(flips))
        better = (lambda d: d > 0) if metric == "acc" else (lambda d: d < 0)
        assert vs["improved"] == sum(better(d) for d in differences)
        assert results["arms"]["uniform"]["eval"][label]["vs_uniform"] is None
    report = (evaluated / "run" / "report.md").read_text()
    assert "## Downstream evaluation" in report
    assert f"| {TASK}/perplexity ↓ | cosine |" in report


def test_evaluated_runs_are_not_evaluated_again(evaluated: Path, tmp_path: Path) -> None:
    shutil.copytree(evaluated, tmp_path / "copy")
    spec = write_spec(tmp_path / "copy", out=str(tmp_path / "copy" / "run"))
    before = (tmp_path / "copy" / "run" / "results.json").read_text()
    result = invoke("eval", str(spec))
    assert result.exit_code == 0, result.output
    assert "nothing to do" in result.output
    (tmp_path / "copy" / "spec.toml").write_text(spec.read_text() + "batch_size = 2\n")
    result = invoke("run", str(spec))  # batch_size changes no score: nothing is evaluated
    assert result.exit_code == 0 and "nothing to do" in result.output, result.output
    assert (tmp_path / "copy" / "run" / "results.json").read_text() == before


def test_status_says_which_trained_runs_are_evaluated(evaluated: Path, tmp_path: Path) -> None:
    from geospec.storage.digests import SEAL, sealed

    run_dir = tmp_path / "run"
    shutil.copytree(evaluated / "run", run_dir)
    found = json.loads(invoke("status", str(run_dir), "--json").output)
    assert [r["evaluated"] for r in found["runs"]] == [True] * len(ARMS) * len(SEEDS)
    (run_dir / "arms" / "cosine" / "seed-1" / "eval.json").unlink()
    other = run_dir / "arms" / "uniform" / "seed-2" / "eval.json"  # scores of another model
    record = {k: v for k, v in json.loads(other.read_text()).items() if k != SEAL}
    other.write_text(json.dumps(sealed({**record, "run_key": "another model"})))
    found = json.loads(invoke("status", str(run_dir), "--json").output)
    unscored = {(r["arm"], r["seed"]) for r in found["runs"] if r["evaluated"] is False}
    assert unscored == {("cosine", 1), ("uniform", 2)}
    table = " ".join(invoke("status", str(run_dir)).output.split())
    assert table.count("not yet evaluated") == 2 and table.count(", evaluated") == 4


def test_an_unknown_task_and_a_spec_without_eval_are_one_line(
    evaluated: Path, tmp_path: Path
) -> None:
    shutil.copytree(evaluated, tmp_path / "copy")
    out = str(tmp_path / "copy" / "run")
    spec = write_spec(tmp_path / "copy", out=out, task="geospec_austen_lastwrd")
    result = invoke("eval", str(spec))
    assert result.exit_code == 2, result.output
    assert "eval.tasks[0]: lm-eval knows no task" in result.output
    assert f"did you mean '{TASK}'" in result.output
    assert "Traceback" not in result.output
    text = write_spec(tmp_path / "copy", out=out).read_text()
    spec.write_text(text[: text.index("[eval]")])
    result = invoke("eval", str(spec))
    assert result.exit_code == 2 and "no [eval] section" in result.output, result.output
