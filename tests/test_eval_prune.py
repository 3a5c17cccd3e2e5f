"""[eval] on a prune's pruned models (the eval extra; nox -s eval): every exported unit scored by
lm-evaluation-harness on the bundled offline task and a task of the spec's own folder, each score
checked against the pruned model's own log-likelihoods computed here (the model read with
geospec.load_pruned, the task's accuracy and perplexity by definition), reused by a second run,
and compared with the baseline arm paired by calibration seed in the prune's report."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.eval, pytest.mark.torch, pytest.mark.usefixtures("one_torch_thread")]
pytest.importorskip("lm_eval")

from test_eval import OWN_LOADER, OWN_YAML, model_last_word_scores  # noqa: E402
from test_prune import invoke, prune_spec  # noqa: E402

TASK = "geospec_austen_lastword"
OWN_TASK = "my_lastword"
LIMIT = 8
SEEDS = (0, 1, 2)
ARMS = ("uniform", "cosine")
PRUNE = {
    "keep": 0.5,
    "calibration": {"windows": 4, "seeds": list(SEEDS)},
    "eval": {"corpora": ["docs.jsonl"], "windows": 4},
    "arms": [
        {"name": "uniform", "schedule": {"kind": "uniform"}},
        {"name": "cosine", "schedule": {"kind": "cosine", "start": 1.2, "end": 0.8}},
    ],
}


def eval_spec(directory: Path, **changes: object) -> Path:
    """The tests' prune spec (a tiny Llama with a word-level tokenizer) with [eval]: the bundled
    task and a last-word task on the word corpus, whose last words the model can learn."""
    spec = prune_spec(directory, **(PRUNE | changes))
    tasks = directory / "tasks"
    tasks.mkdir(exist_ok=True)
    (tasks / "my_lastword.yaml").write_text(OWN_YAML)
    (tasks / "utils.py").write_text(OWN_LOADER)
    rows = [json.loads(line) for line in (directory / "other.jsonl").read_text().splitlines()]
    texts = [{"text": " ".join(row["text"].split()[:12])} for row in rows[:LIMIT]]
    (tasks / "data.jsonl").write_text("".join(json.dumps(row) + "\n" for row in texts))
    spec.write_text(
        spec.read_text() + f'\n[eval]\ntasks = ["{TASK}", "{OWN_TASK}"]\n'
        f'include = ["tasks"]\nlimit = {LIMIT}\n'
    )
    return spec


@pytest.fixture(scope="module")
def scored(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("eval-prune")
    output = invoke("prune", str(eval_spec(directory)))
    (directory / "output.txt").write_text(output)
    return directory


def unit(run: Path, arm: str, seed: int) -> Path:
    return run / "prune" / "keep-0.5" / arm / f"seed-{seed}"


def scores(run: Path, arm: str, seed: int) -> dict[str, Any]:
    found: dict[str, Any] = json.loads((unit(run, arm, seed) / "eval.json").read_text())["tasks"]
    return found


def last_word_scores(model_dir: Path, texts: list[str]) -> tuple[float, float]:
    """Accuracy and perplexity of each text's last word given the rest, by definition
    (test_eval's :func:`model_last_word_scores`), on the pruned model read at its true widths."""
    import torch
    from transformers import AutoTokenizer

    import geospec

    model = geospec.load_pruned(model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    window = model.config.max_position_embeddings
    return model_last_word_scores(model, tokenizer, window, texts)


def test_every_pruned_model_is_scored_as_its_own_likelihoods_say(scored: Path) -> None:
    from geospec.evaluate.tasks import AUSTEN_LASTWORD_FILE

    run = scored / "run"
    bundled = [json.loads(line)["text"] for line in AUSTEN_LASTWORD_FILE.read_text().splitlines()]
    own = [
        json.loads(line)["text"]
        for line in (scored / "tasks" / "data.jsonl").read_text().splitlines()
    ]
    for arm, seed in itertools.product(ARMS, SEEDS):
        record = json.loads((unit(run, arm, seed) / "eval.json").read_text())
        result = json.loads((unit(run, arm, seed) / "result.json").read_text())
        assert record["unit_key"] == result["key"]
        task = record["tasks"][TASK]
        accuracy, perplexity = last_word_scores(unit(run, arm, seed) / "model", bundled[:LIMIT])
        assert task["samples"] == LIMIT
        assert task["metrics"]["acc"] == pytest.approx(accuracy, abs=1e-9)
        assert task["metrics"]["perplexity"] == pytest.approx(perplexity, rel=1e-4)
        accuracy, perplexity = last_word_scores(unit(run, arm, seed) / "model", own)
        assert record["tasks"][OWN_TASK]["metrics"]["acc"] == pytest.approx(accuracy, abs=1e-9)
    # the models differ: the scores are each unit's own, not one model's
    perplexities = {scores(run, a, s)[TASK]["metrics"]["perplexity"] for a in ARMS for s in SEEDS}
    assert len(perplexities) == len(ARMS) * len(SEEDS)


def test_the_report_pairs_every_metric_with_the_baseline_by_calibration_seed(
    scored: Path,
) -> None:
    from scipy import stats

    from geospec.report.prune import eval_rows, with_unit_scores

    run = scored / "run"
    record = with_unit_scores(json.loads((run / "prune.json").read_text()), run)
    budget = record["budgets"][0]
    rows = {(row[0].split(" ")[0], row[1]): row for row in eval_rows(record, budget)}
    for label in (f"{TASK}/acc", f"{TASK}/perplexity", f"{OWN_TASK}/acc"):
        task, metric = label.split("/")
        per_seed = {a: [scores(run, a, s)[task]["metrics"][metric] for s in SEEDS] for a in ARMS}
        differences = [a - b for a, b in zip(per_seed["cosine"], per_seed["uniform"], strict=True)]
        row = rows[(label, "cosine")]
        assert float(row[2]) == pytest.approx(sum(per_seed["cosine"]) / len(SEEDS), rel=1e-3)
        assert float(row[3]) == pytest.approx(sum(differences) / len(SEEDS), rel=1e-3, abs=1e-4)
        if stats.tstd(differences) > 0:
            mean = sum(differences) / len(SEEDS)
            low, high = stats.t.interval(0.95, len(SEEDS) - 1, mean, stats.sem(differences))
            assert row[4] == f"[{low:+.4g}, {high:+.4g}]"
        flips = [sum(s * d for s, d in zip(signs, differences, strict=True))
                 for signs in itertools.product((1, -1), repeat=len(SEEDS))]  # fmt: skip
        extreme = sum(abs(f) >= abs(sum(differences)) - 1e-9 for f in flips)
        assert row[6] == f"{extreme / len(flips):.3g}"
        better = (lambda d: d > 0) if metric == "acc" else (lambda d: d < 0)
        assert row[5] == f"{sum(better(d) for d in differences)}/{len(SEEDS)}"
        assert rows[(label, "uniform")][3:] == ["-"] * 5
    text = (run / "prune" / "report.md").read_text()
    assert "Downstream evaluation of the pruned models" in text
    assert f"| {TASK}/perplexity ↓ | cosine |" in text
    assert f"| {TASK}/acc ↑ | cosine |" in (scored / "output.txt").read_text()


def test_a_second_run_evaluates_nothing_again(scored: Path) -> None:
    """In place (a copied run directory is another checkpoint path: the reference's key moves):
    geospec eval and geospec prune again score no model and rewrite no record; a damaged
    record is scored again, alone, to the same scores."""
    spec, run = scored / "spec.toml", scored / "run"
    records = {path: path.read_bytes() for path in run.rglob("eval.json")}
    assert len(records) == len(ARMS) * len(SEEDS)
    output = invoke("eval", str(spec))
    assert "eval: pruned" not in output and "every pruned model is evaluated" in output, output
    assert f"| {TASK}/perplexity ↓ | cosine |" in (run / "report.md").read_text()
    output = invoke("prune", str(spec))
    assert "eval: pruned" not in output, output
    assert {path: path.read_bytes() for path in records} == records
    damaged = unit(run, "cosine", 1) / "eval.json"
    before = scores(run, "cosine", 1)
    damaged.write_text(damaged.read_text().replace('"acc"', '"acc2"', 1))
    output = invoke("eval", str(spec))
    assert output.count(f": {TASK}, {OWN_TASK}") == 1, output  # one model scored
    assert "eval: pruned cosine at keep 0.5, seed 1: eval.json was changed after geospec" in output
    assert scores(run, "cosine", 1) == before


def test_eval_without_an_exported_model_is_one_line(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from geospec.cli import cli

    spec = eval_spec(tmp_path, export=False)
    result = CliRunner().invoke(cli, ["validate", str(spec)])
    assert result.exit_code == 2, result.output
    assert "export = false writes no pruned model to evaluate" in result.output
    assert "Traceback" not in result.output
