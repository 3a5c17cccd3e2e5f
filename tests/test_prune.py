"""Pruning (geospec.prune): widths at a pruned budget, the pruned model's export as a plain
transformers checkpoint (reloaded and recomputed with transformers alone), and its loss."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import hf_models
import numpy as np
import pytest
import tomlkit
import torch
import torch.nn.functional as F
import transformers as hf
from click.testing import CliRunner

from geospec.cli import cli
from geospec.errors import UsageError
from geospec.measure.probe import find_ffn_sites
from geospec.measure.sensitivity import logits_of
from geospec.plugin import create_plugin
from geospec.prune.allocate import allocate, pruned_dims
from geospec.prune.apply import (
    calibration_windows,
    eval_loss,
    export_pruned,
    ffn_parameters,
    neuron_scores,
    pruned,
)
from geospec.spec.sections import ArmSpec

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_torch_thread")]


def arms(*tables: tuple[str, object]) -> list[ArmSpec]:
    return [ArmSpec.model_validate({"name": n, "schedule": s}) for n, s in tables]


def test_every_arm_has_the_pruned_budget_and_no_layer_grows() -> None:
    dims = pruned_dims(n_layers=4, d_model=32, width=64, multiple=8, keep=0.5, activation="swiglu")
    assert (dims.ffn_width, dims.budget, dims.max_width) == (32, 128, 64)
    scores = [[float((i * 7 + layer) % 13) for i in range(64)] for layer in range(4)]
    profiles = {"p": [4.0, 3.0, 2.0, 1.0]}
    widths = allocate(
        arms(
            ("uniform", "uniform"),
            ("flap", "flap"),
            ("owl", "owl"),
            ("cosine", {"kind": "cosine", "start": 1.5, "end": 0.5}),
            ("geometric", {"kind": "geometric", "profile": "p"}),
            ("sorted", {"kind": "sorted", "of": "geometric"}),
        ),
        dims,
        profiles,
        scores,
    )
    assert widths["uniform"] == [32] * 4
    for name, values in widths.items():
        assert sum(values) == 128 and all(8 <= w <= 64 and w % 8 == 0 for w in values), name
    assert widths["geometric"][0] >= widths["geometric"][-1]


def test_a_schedule_that_would_grow_a_layer_is_refused_by_name() -> None:
    dims = pruned_dims(4, 32, 64, 8, keep=0.75, activation="gelu")  # uniform 48
    with pytest.raises(UsageError, match=r"prune arm 'steep'.*layer 0 would grow to 80"):
        allocate(arms(("steep", {"kind": "cosine", "start": 1.7, "end": 0.3})), dims, {}, [])
    with pytest.raises(UsageError, match="below one multiple"):
        pruned_dims(4, 32, 64, 16, keep=0.1, activation="gelu")


def test_calibration_samples_are_seeded_and_disjoint_windows() -> None:
    tokens = np.arange(1000)
    first, again = calibration_windows(tokens, 10, 20, 0), calibration_windows(tokens, 10, 20, 0)
    other = calibration_windows(tokens, 10, 20, 1)
    assert (first == again).all() and not (first == other).all()
    assert len(set(first.tolist())) == 20 and all(s % 10 == 0 and s + 10 <= 1000 for s in first)
    with pytest.raises(UsageError, match="exceeds the 100 training windows"):
        calibration_windows(tokens, 10, 101, 0)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_an_exported_pruned_model_is_a_plain_checkpoint_that_computes_the_same(
    family: str, tmp_path: Path
) -> None:
    """Pruned to uneven widths, exported padded, read back with AutoModelForCausalLM alone: the
    same logits, the true widths in config.json, and its perplexity recomputed by plain
    cross-entropy equals the one geospec measured."""
    model = hf_models.llama() if family == "llama" else hf_models.gpt2()
    ids = torch.randint(0, hf_models.VOCAB, (3, 17), generator=torch.Generator().manual_seed(0))
    sites = find_ffn_sites(model, hf_models.WIDTH, lambda: logits_of(model, ids[:1, :-1]))
    importance = create_plugin("importance", {"kind": "activation"})
    tokens = np.random.default_rng(0).integers(0, hf_models.VOCAB, 400)
    starts = calibration_windows(tokens, 16, 8, seed=0)
    scores, orders = neuron_scores(model, sites, importance, tokens, starts, 16, 4)
    full = sites[0].ffn.down_proj.in_features if family == "llama" else 4 * hf_models.WIDTH
    widths = [full // 2, full // 4, full // 2 + 8][: len(sites)]
    batches = [(ids[:, :-1], ids[:, 1:])]
    with torch.no_grad(), pruned(sites, orders, widths):
        expected = logits_of(model, ids[:, :-1])
        loss = eval_loss(model, batches)
        kept = ffn_parameters(sites)
        export_pruned(model, sites, widths, tmp_path / "pruned", padded=True)
    assert ffn_parameters(sites) > kept  # put back
    reloaded = hf.AutoModelForCausalLM.from_pretrained(tmp_path / "pruned").eval()
    assert reloaded.config.geospec["ffn_widths"] == widths
    with torch.no_grad():
        got = reloaded(input_ids=ids[:, :-1]).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    plain = F.cross_entropy(got.flatten(0, 1), ids[:, 1:].flatten())
    assert float(plain) == pytest.approx(loss, rel=1e-5)
    # the orderings are the scores' (best first)
    for layer_scores, order in zip(scores, orders, strict=True):
        assert [layer_scores[i] for i in order] == sorted(layer_scores, reverse=True)


# geospec prune end to end, on a small pretrained Llama checkpoint


def word_checkpoint(directory: Path) -> Path:
    """A tiny Llama with a word-level tokenizer, saved as a Hugging Face checkpoint."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "</s>": 1} | {f"w{i}": i + 2 for i in range(95)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    hf.PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="</s>", unk_token="[UNK]"
    ).save_pretrained(directory)
    hf_models.llama(intermediate_size=64).save_pretrained(directory)
    return directory


def word_corpus(path: Path, seed: int, lines: int = 200) -> Path:
    """Documents of words with a learnable structure: word i is mostly followed by word i + 1."""
    rng = np.random.default_rng(seed)
    documents = []
    for _ in range(lines):
        start = rng.integers(0, 95)
        words = [
            (start + j + int(rng.random() < 0.2) * rng.integers(0, 95)) % 95 for j in range(60)
        ]
        documents.append(json.dumps({"text": " ".join(f"w{w}" for w in words)}))
    path.write_text("\n".join(documents))
    return path


PRUNE_SPEC = {
    "keep": [0.75, 0.5],
    "calibration": {"windows": 8, "seeds": [0, 1, 2]},
    "eval": {"corpora": ["docs.jsonl", "other.jsonl"], "windows": 6},
    "arms": [
        {"name": "uniform", "schedule": {"kind": "uniform"}},
        {"name": "flap", "schedule": {"kind": "flap"}},
        {"name": "owl", "schedule": {"kind": "owl"}},
        {"name": "cosine", "schedule": {"kind": "cosine", "start": 1.2, "end": 0.8}},
        {"name": "shift", "schedule": {"kind": "geometric", "profile": "shift/spherical"}},
    ],
}


def prune_spec(directory: Path, **changes: object) -> Path:
    from geospec.testing import minimal_spec

    word_checkpoint(directory / "model")
    word_corpus(directory / "docs.jsonl", 0)
    word_corpus(directory / "other.jsonl", 1, lines=40)
    spec = minimal_spec(
        out=str(directory / "run"),
        model={"n_layers": 3, "d_model": 32, "n_heads": 4, "ffn_width": 64, "seq_len": 16,
               "multiple_of": 8},
        data={"files": ["docs.jsonl"], "tokenizer": {"kind": "pretrained", "path": "model"}},
        reference={"checkpoint": "model"},
        probe={"tokens": 64},
        measure=[{"geometry": "spherical", "statistic": "shift"}],
        prune=PRUNE_SPEC | changes,
        probe_only=True,
    )  # fmt: skip
    path = directory / "spec.toml"
    path.write_text(tomlkit.dumps(spec))
    return path


def invoke(*args: str) -> str:
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code == 0, result.output + repr(result.exception)
    return result.output


@pytest.fixture(scope="module")
def pruned_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("prune")
    output = invoke("prune", str(prune_spec(directory)))
    (directory / "output.txt").write_text(output)
    return directory


def test_prune_writes_every_arm_budget_and_seed(pruned_run: Path) -> None:
    record = json.loads((pruned_run / "run" / "prune.json").read_text())
    assert [b["keep"] for b in record["budgets"]] == [0.75, 0.5]
    for budget in record["budgets"]:
        assert set(budget["arms"]) == {"uniform", "flap", "owl", "cosine", "shift"}
        params = {p for arm in budget["arms"].values() for p in arm["ffn_params"].values()}
        assert len(params) == 1  # exactly equal FFN parameters (a budget of whole multiples)
        for arm in budget["arms"].values():
            for widths in arm["widths"].values():
                assert sum(widths) == budget["budget"] and max(widths) <= 64
            assert set(arm["loss"]) == {"docs.jsonl", "other.jsonl"}
            assert set(arm["loss"]["docs.jsonl"]) == {"0", "1", "2"}
    uniform = record["budgets"][1]["arms"]["uniform"]["loss"]["docs.jsonl"]
    assert all(v != record["reference"]["docs.jsonl"] for v in uniform.values())  # a random
    # model's loss can go either way when it loses neurons; only that it changed is certain
    output = (pruned_run / "output.txt").read_text()
    assert "## Pruning the reference" in output and "pruned models: 30/30" in output
    report = (pruned_run / "run" / "prune" / "report.md").read_text()
    assert "Every arm has the same FFN parameters." in report and "| flap |" in report


def test_a_pruned_checkpoint_loads_with_plain_transformers_to_the_recorded_loss(
    pruned_run: Path,
) -> None:
    """The exported owl model (true widths) read by geospec.load_pruned is a plain
    LlamaForCausalLM, and plain cross-entropy of its logits on the same validation windows
    (geospec's data pipeline gives the tokens) equals the loss geospec recorded."""
    import geospec
    from geospec.engine.batches import validation_windows, window_tensors
    from geospec.engine.token_data import prepare_data
    from geospec.spec.loading import load_spec

    record = json.loads((pruned_run / "run" / "prune.json").read_text())
    unit = pruned_run / "run" / "prune" / "keep-0.5" / "owl" / "seed-1"
    model = geospec.load_pruned(unit / "model")
    widths = record["budgets"][1]["arms"]["owl"]["widths"]["1"]
    assert type(model) is hf.LlamaForCausalLM and model.config.geospec["ffn_widths"] == widths
    assert [layer.mlp.down_proj.in_features for layer in model.model.layers] == widths
    spec = load_spec(pruned_run / "spec.toml")
    data = prepare_data(spec.data, pruned_run / "cache", spec_dir=pruned_run)
    tokens = data.val[:-1] if int(data.val[-1]) == data.eot_id else data.val
    x, y = window_tensors(tokens, validation_windows(len(tokens), 16, 6 * 16), 16)
    with torch.no_grad():
        logits = model(input_ids=x).logits
    loss = float(F.cross_entropy(logits.flatten(0, 1).float(), y.flatten()))
    recorded = record["budgets"][1]["arms"]["owl"]["loss"]["docs.jsonl"]["1"]
    assert loss == pytest.approx(recorded, rel=1e-5)


def test_geospec_export_writes_a_prune_unit_or_says_why_not(
    pruned_run: Path, tmp_path: Path
) -> None:
    """geospec export on a prune unit (it used to say "no readable result.json"): --format hf
    copies the unit's checkpoint; GGUF needs a BPE tokenizer (this run's is word-level: one
    line); a unit pruned without export is one line naming the setting."""
    import shutil

    import geospec

    unit = pruned_run / "run" / "prune" / "keep-0.5" / "owl" / "seed-1"
    result = CliRunner().invoke(cli, ["export", str(unit), "--to", str(tmp_path / "owl")])
    assert result.exit_code == 0, result.output
    widths = json.loads((unit / "result.json").read_text())["widths"]
    assert f"widths {' '.join(map(str, widths))}" in result.output
    ids = torch.tensor([[3, 4, 5, 6, 7]])
    with torch.no_grad():
        copied = geospec.load_pruned(tmp_path / "owl")(ids).logits
        torch.testing.assert_close(copied, geospec.load_pruned(unit / "model")(ids).logits)
    if importlib.util.find_spec("gguf") is not None:
        out = tmp_path / "owl.gguf"
        words = CliRunner().invoke(cli, ["export", str(unit), "--to", str(out), "--format", "gguf"])
        assert words.exit_code == 2 and "not a byte-level BPE" in words.output
        assert len(words.output.strip().splitlines()) == 1 and not out.exists()
    bare = tmp_path / "run" / "prune" / "keep-0.5" / "owl" / "seed-1"
    shutil.copytree(unit, bare, ignore=shutil.ignore_patterns("model"))
    missing = CliRunner().invoke(cli, ["export", str(bare), "--to", str(tmp_path / "none")])
    assert missing.exit_code == 2 and "export = true" in missing.output
    assert "no readable" not in missing.output and not (tmp_path / "none").exists()


def test_a_rerun_reuses_every_pruned_model(pruned_run: Path) -> None:
    output = invoke("prune", str(pruned_run / "spec.toml"))
    assert "prune: up to date" in output and "pruned models" not in output


def test_a_taper_that_would_grow_a_layer_is_one_line(tmp_path: Path) -> None:
    arms = [
        *PRUNE_SPEC["arms"][:1],
        {"name": "steep", "schedule": {"kind": "cosine", "start": 1.8, "end": 0.2}},
    ]  # type: ignore[misc]
    spec = prune_spec(tmp_path, arms=arms, keep=0.75)
    result = CliRunner().invoke(cli, ["prune", str(spec)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    last = result.output.strip().splitlines()[-1]
    assert "prune arm 'steep'" in last and "beyond its pretrained width 64" in last
    assert not (tmp_path / "run" / "prune.json").exists()


def test_an_interrupted_prune_recomputes_only_the_missing_units(pruned_run: Path) -> None:
    """prune.json and one unit's record lost (a kill between units): the rerun keeps the 29
    others (their exported models untouched) and ends with the same prune.json."""
    run = pruned_run / "run"
    before = json.loads((run / "prune.json").read_text())
    kept = run / "prune" / "keep-0.75" / "flap" / "seed-2" / "model" / "model.safetensors"
    stamp = kept.stat().st_mtime_ns
    (run / "prune.json").unlink()
    (run / "prune" / "keep-0.5" / "shift" / "seed-0" / "result.json").unlink()
    invoke("prune", str(pruned_run / "spec.toml"))
    after = json.loads((run / "prune.json").read_text())
    assert after == before and kept.stat().st_mtime_ns == stamp


@pytest.mark.parametrize("damaged", ["prune.json", "unit"])
def test_an_edited_prune_record_is_recomputed(pruned_run: Path, damaged: str) -> None:
    """A loss edited behind geospec's back (its key intact) breaks the seal: the rerun
    recomputes what it must and ends with the record an undamaged run has."""
    run = pruned_run / "run"
    before = json.loads((run / "prune.json").read_text())
    path = run / "prune.json"
    if damaged == "unit":
        path = run / "prune" / "keep-0.75" / "owl" / "seed-0" / "result.json"
    data = json.loads(path.read_text())
    if damaged == "unit":
        data["loss"]["docs.jsonl"] -= 0.5
        (run / "prune.json").unlink()  # so that the stage runs and meets the unit
    else:
        data["budgets"][0]["arms"]["owl"]["loss"]["docs.jsonl"]["0"] -= 0.5
    path.write_text(json.dumps(data))
    output = invoke("prune", str(pruned_run / "spec.toml"))
    if damaged == "prune.json":
        assert "! prune: prune.json was changed after geospec wrote it" in output
    assert json.loads((run / "prune.json").read_text()) == before


def test_healing_fine_tunes_each_pruned_model_from_its_own_weights(tmp_path: Path) -> None:
    """heal.steps: each pruned model, imported into geospec's engine with its uneven widths, is
    trained on [data]'s text; at a vanishing learning rate the healed loss is the pruned loss
    (the import is exact and training starts from the pruned weights), at a real one it moves."""
    arms = PRUNE_SPEC["arms"][:2]  # uniform and flap
    spec = prune_spec(
        tmp_path,
        arms=arms,
        keep=0.5,
        calibration={"windows": 8, "seeds": [0]},
        export=False,
        heal={"steps": 2, "lr": 1e-12, "batch_size": 2},
    )
    invoke("prune", str(spec))
    record = json.loads((tmp_path / "run" / "prune.json").read_text())
    for name in ("uniform", "flap"):
        arm = record["budgets"][0]["arms"][name]
        for corpus in ("docs.jsonl", "other.jsonl"):
            assert arm["healed_loss"][corpus]["0"] == pytest.approx(
                arm["loss"][corpus]["0"], abs=1e-5
            )
    heal_dir = tmp_path / "run" / "prune" / "keep-0.5" / "flap" / "seed-0" / "heal"
    config = json.loads((heal_dir / "config.json").read_text())
    assert config["ffn_widths"] == record["budgets"][0]["arms"]["flap"]["widths"]["0"]
    assert config["norm_eps"] == pytest.approx(1e-6)  # the checkpoint's own epsilon
    # a real learning rate: the loss moves
    spec.write_text(spec.read_text().replace("lr = 1e-12", "lr = 0.01"))
    invoke("prune", str(spec))
    healed = json.loads((tmp_path / "run" / "prune.json").read_text())["budgets"][0]["arms"]
    moved = healed["uniform"]["healed_loss"]["docs.jsonl"]["0"]
    assert abs(moved - healed["uniform"]["loss"]["docs.jsonl"]["0"]) > 1e-3
    assert "| docs.jsonl, healed |" in (tmp_path / "run" / "prune" / "report.md").read_text()


def test_healing_a_model_geospec_cannot_import_is_one_line(tmp_path: Path) -> None:
    spec = prune_spec(tmp_path, heal={"steps": 2}, arms=PRUNE_SPEC["arms"][:1], keep=0.5)
    hf_models.gpt2().save_pretrained(tmp_path / "model")  # replaces the Llama weights
    # [model] as a user of this GPT-2 would leave it: the shape is read from its config.json
    data = tomlkit.parse(spec.read_text())
    data["model"] = {"seq_len": 16, "multiple_of": 8}
    spec.write_text(tomlkit.dumps(data))
    result = CliRunner().invoke(cli, ["prune", str(spec)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    last = result.output.strip().splitlines()[-1]
    assert "prune.heal:" in last and "not Llama-family" in last
    assert not (tmp_path / "run" / "prune.json").exists()


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        ({"keep": 1.5}, "prune.keep", "less than or equal to 1"),
        ({"keep": [0.5, 0.0]}, "prune.keep", "greater than 0"),
        ({"baseline": "nope"}, "prune", "baseline 'nope' is not one of the arms"),
        ({"calibration": {"seeds": [1, 1]}}, "prune.calibration.seeds", "distinct"),
        ({"heal": {"steps": -1}}, "prune.heal.steps", "greater than or equal to 0"),
    ],
)
def test_bad_prune_settings_name_the_field(
    change: dict[str, object], field: str, message: str
) -> None:
    from geospec.errors import SpecError
    from geospec.spec.loading import validate_spec
    from geospec.testing import minimal_spec

    spec = minimal_spec(
        probe_only=True,
        reference={"checkpoint": "model"},
        data={"tokenizer": {"kind": "pretrained", "path": "model"}},
        prune=PRUNE_SPEC | change,
        measure=[{"geometry": "spherical", "statistic": "shift"}],
    )
    with pytest.raises(SpecError) as error:
        validate_spec(spec)
    assert field in str(error.value) and message in str(error.value)


def test_a_prune_without_a_checkpoint_or_with_a_short_eval_corpus_is_one_line(
    tmp_path: Path,
) -> None:
    from geospec.errors import SpecError
    from geospec.spec.loading import validate_spec
    from geospec.testing import minimal_spec

    with pytest.raises(SpecError, match=r"prunes a pretrained reference\.checkpoint"):
        validate_spec(minimal_spec(prune={"arms": PRUNE_SPEC["arms"][:1]}))
    spec = prune_spec(tmp_path, arms=PRUNE_SPEC["arms"][:1], keep=0.5)
    (tmp_path / "other.jsonl").write_text(json.dumps({"text": "w1 w2 w3"}))
    result = CliRunner().invoke(cli, ["prune", str(spec)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    last = result.output.strip().splitlines()[-1]
    assert "prune.eval.corpora: 'other.jsonl'" in last and "val split is empty" in last
    # long enough to split, too short for the windows asked
    (tmp_path / "other.jsonl").write_text(
        "\n".join(json.dumps({"text": f"w{i} w{i + 1} w{i + 2}"}) for i in range(40))
    )
    result = CliRunner().invoke(cli, ["prune", str(spec)])
    last = result.output.strip().splitlines()[-1]
    assert result.exit_code == 2 and "fewer than 6 windows of 16 need" in last


def test_the_report_has_the_pruning_section_and_its_plot(pruned_run: Path) -> None:
    invoke("report", str(pruned_run / "run"))
    report = (pruned_run / "run" / "report.md").read_text()
    assert "## Pruning the reference" in report and "![prune](plots/prune.png)" in report
    assert (pruned_run / "run" / "plots" / "prune.png").stat().st_size > 1000
