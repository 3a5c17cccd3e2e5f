"""What to ship (prune.select): the recommended arm per keep fraction, chosen on held-out
windows of the calibration corpus that no width-setting stage and no eval reads; its export."""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path

import pytest
import tomlkit
import torch
import torch.nn.functional as F
from click.testing import CliRunner
from test_prune import invoke, prune_spec

import geospec
from geospec.cli import cli

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_torch_thread")]

WINDOWS = 4
SEQ_LEN = 16


def selection_losses(directory: Path, model_dir: Path) -> list[float]:
    """Plain transformers on an exported model: each of the last WINDOWS windows of docs.jsonl's
    validation split (geospec's data pipeline gives the tokens), its mean next-token loss."""
    from geospec.engine.batches import validation_windows, window_tensors
    from geospec.engine.token_data import prepare_data
    from geospec.spec.loading import load_spec

    model = geospec.load_pruned(model_dir)
    spec = load_spec(directory / "spec.toml")
    data = prepare_data(spec.data, directory / "cache", spec_dir=directory)
    tokens = data.val[:-1] if int(data.val[-1]) == data.eot_id else data.val
    tail = tokens[len(tokens) - (WINDOWS * SEQ_LEN + 1) :]
    x, y = window_tensors(tail, validation_windows(len(tail), SEQ_LEN, WINDOWS * SEQ_LEN), SEQ_LEN)
    with torch.no_grad():
        logits = model(input_ids=x).logits
    per_token = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten(), reduction="none")
    return per_token.view(y.shape).mean(dim=1).tolist()


@pytest.fixture(scope="module")
def selected(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("select")
    invoke("prune", str(prune_spec(directory, select={"windows": WINDOWS})))
    return directory


def test_the_recommended_arm_has_the_lowest_loss_on_the_selection_windows(
    selected: Path,
) -> None:
    """Every unit's selection losses are plain transformers' losses of its exported model on
    the last windows of [data]'s validation split, and the recommended arm is the one whose
    mean over seeds and windows is lowest, its margin the mean gap to the next arm."""
    record = json.loads((selected / "run" / "prune.json").read_text())
    for budget in record["budgets"]:
        means = {}
        for name, arm in budget["arms"].items():
            values = [v for losses in arm["select_loss"].values() for v in losses]
            means[name] = sum(values) / len(values)
        ranked = sorted(means, key=lambda name: (means[name], name))  # ties: by name
        chosen = budget["recommended"]
        assert (chosen["arm"], chosen["next"]) == (ranked[0], ranked[1])
        assert chosen["margin"] == pytest.approx(means[ranked[1]] - means[ranked[0]], abs=1e-9)
        low, high = chosen["margin_ci"]
        assert low <= chosen["margin"] <= high
    unit = selected / "run" / "prune" / "keep-0.5" / "owl" / "seed-1"
    owl = record["budgets"][1]["arms"]["owl"]["select_loss"]["1"]
    assert selection_losses(selected, unit / "model") == pytest.approx(owl, rel=1e-5)


def test_changing_the_eval_corpora_changes_no_recommendation(
    selected: Path, tmp_path: Path
) -> None:
    """The same prune scored on another eval corpus only: the same selection losses and the
    same recommendation, while the eval losses differ."""
    invoke("prune", str(prune_spec(tmp_path, select={"windows": WINDOWS},
                                   eval={"corpora": ["other.jsonl"], "windows": 3})))  # fmt: skip
    first, second = (
        json.loads((d / "run" / "prune.json").read_text()) for d in (selected, tmp_path)
    )
    for a, b in zip(first["budgets"], second["budgets"], strict=True):
        # (what the recommended model ships as is keyed by its unit: measured again, alike)
        a["recommended"].pop("shipped"), b["recommended"].pop("shipped")
        assert a["recommended"] == b["recommended"]
        for name, arm in a["arms"].items():
            assert arm["select_loss"] == b["arms"][name]["select_loss"]
    assert set(first["reference"]) != set(second["reference"])


def test_the_report_starts_with_what_to_ship(selected: Path) -> None:
    record = json.loads((selected / "run" / "prune.json").read_text())
    report = (selected / "run" / "prune" / "report.md").read_text()
    assert report.startswith("## What to ship")
    for budget in record["budgets"]:
        arm = budget["recommended"]["arm"]
        assert f"- keep {budget['keep']:g}: **{arm}**" in report
        assert f"--export best@{budget['keep']:g}" in report


def test_export_best_writes_the_recommended_arms_model(selected: Path, tmp_path: Path) -> None:
    record = json.loads((selected / "run" / "prune.json").read_text())
    budget = record["budgets"][1]
    arm = budget["recommended"]["arm"]
    out = tmp_path / "best"
    invoke("prune", str(selected / "spec.toml"), "--export", "best@0.5", "--to", str(out))
    widths = budget["arms"][arm]["widths"]["0"]
    assert geospec.load_pruned(out).config.geospec["ffn_widths"] == widths


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--export", "best@0.3", "--to", "x"], "must be one of prune.keep 0.75, 0.5"),
        # --set reaches the check too: the spec's keep 0.5 is set away, so best@0.5 is refused
        (
            ["--set", "prune.keep=[0.75, 0.25]", "--export", "best@0.5", "--to", "x"],
            "must be one of prune.keep 0.75, 0.25",
        ),
        (["--export", "best@0.5", "--to", "x", "--arms", "owl"], "drop --arms and --keep"),
        (["--format", "gguf"], "--export ARM@KEEP and --to DIR go together"),
        (["--export", "owl@0.5", "--to", "x", "--format", "gguf", "--padded"], "--padded is for"),
    ],
)
def test_a_bad_best_export_is_one_line(
    selected: Path, tmp_path: Path, args: list[str], message: str
) -> None:
    args = [a if a != "x" else str(tmp_path / "x") for a in args]
    result = CliRunner().invoke(cli, ["prune", str(selected / "spec.toml"), *args])
    assert result.exit_code == 2 and message in result.output
    assert len(result.output.strip().splitlines()) == 1 and not (tmp_path / "x").exists()


def test_best_without_select_or_with_one_arm_or_too_short_a_corpus_is_one_line(
    tmp_path: Path,
) -> None:
    plain = prune_spec(tmp_path / "plain") if (tmp_path / "plain").mkdir() is None else None
    assert plain is not None
    result = CliRunner().invoke(
        cli, ["prune", str(plain), "--export", "best@0.5", "--to", str(tmp_path / "x")]
    )
    assert result.exit_code == 2 and "add [prune] select" in result.output
    (tmp_path / "one").mkdir()
    one = prune_spec(
        tmp_path / "one", select={"windows": 2},
        arms=[{"name": "uniform", "schedule": {"kind": "uniform"}}],
    )  # fmt: skip
    result = CliRunner().invoke(cli, ["validate", str(one)])
    assert result.exit_code == 2 and "prune.select" in result.output
    assert "there is one (uniform)" in result.output
    (tmp_path / "short").mkdir()
    short = prune_spec(tmp_path / "short", select={"windows": 1000})
    result = CliRunner().invoke(cli, ["prune", str(short)])
    assert result.exit_code == 2  # said before any unit is computed
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert errors == [result.output.strip().splitlines()[-1]]
    assert errors[0].startswith("error: prune.select.windows: [data]'s validation split has")
    assert "need 16097" in errors[0] and not (tmp_path / "short" / "run" / "prune").exists()


def test_what_to_ship_shows_the_models_greedy_continuations(selected: Path) -> None:
    """prune.json's continuations are transformers' own greedy generate of each fixed prompt,
    by the unpruned checkpoint and by the recommended arm's exported model (the first
    calibration seed's cut), decoded by the checkpoint's tokenizer; the report prints them."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from geospec.prune.continuations import CONTINUATION_TOKENS
    from geospec.prune.select import PROMPTS

    record = json.loads((selected / "run" / "prune.json").read_text())
    found = record["continuations"]
    assert found["prompts"] == list(PROMPTS) and found["seed"] == record["seeds"][0]
    tokenizer = AutoTokenizer.from_pretrained(selected / "model")

    def generated(model: torch.nn.Module) -> list[str]:
        texts = []
        for prompt in PROMPTS:
            ids = torch.tensor([tokenizer(prompt, add_special_tokens=False).input_ids])
            out = model.generate(  # type: ignore[operator]
                ids, max_new_tokens=CONTINUATION_TOKENS, do_sample=False
            )  # stops at the tokenizer's end of text, as geospec's does
            texts.append(tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True))
        return texts

    assert found["reference"] == generated(AutoModelForCausalLM.from_pretrained(selected / "model"))
    for budget in record["budgets"]:
        arm, keep = budget["recommended"]["arm"], f"{budget['keep']:g}"
        unit = selected / "run" / "prune" / f"keep-{keep}" / arm / f"seed-{found['seed']}"
        assert found[keep] == generated(geospec.load_pruned(unit / "model"))
    report = (selected / "run" / "prune" / "report.md").read_text()
    assert f"- `{PROMPTS[0]}`" in report and "  - unpruned: `" in report


def test_what_to_ship_counts_every_parameter_of_the_model_it_names(selected: Path) -> None:
    """The unpruned model's parameters (a tied embedding once) and each recommended model's,
    against the exported model's own count."""
    from transformers import AutoModelForCausalLM

    from geospec.report.prune import total_parameters

    record = json.loads((selected / "run" / "prune.json").read_text())
    unpruned = AutoModelForCausalLM.from_pretrained(selected / "model")
    assert record["parameters"]["total"] == sum(p.numel() for p in unpruned.parameters())
    report = (selected / "run" / "prune" / "report.md").read_text()
    for budget in record["budgets"]:
        arm = budget["recommended"]["arm"]
        unit = selected / "run" / "prune" / f"keep-{budget['keep']:g}" / arm / "seed-0"
        exported = sum(p.numel() for p in geospec.load_pruned(unit / "model").parameters())
        ffn = budget["arms"][arm]["ffn_params"]["0"]
        assert total_parameters(record, ffn) == exported
        assert f"{exported:,} parameters" in report


def test_a_spec_can_export_the_recommended_arm(selected: Path, tmp_path: Path) -> None:
    """export = ["best@0.5"]: once every unit is scored, the recommended arm's units at keep 0.5
    (every calibration seed) and no other write their model, the same model the selection
    scored; a later prune finds them written and computes nothing."""
    record = json.loads((selected / "run" / "prune.json").read_text())
    best = record["budgets"][1]["recommended"]["arm"]
    spec = prune_spec(tmp_path, select={"windows": WINDOWS}, export=["best@0.5"])
    output = invoke("prune", str(spec))
    assert f"exported the recommended {best}@0.5 (seed 0)" in output
    prune_dir = tmp_path / "run" / "prune"
    written = sorted(
        p.parent.relative_to(prune_dir).as_posix() for p in prune_dir.glob("*/*/*/model")
    )
    assert written == [f"keep-0.5/{best}/seed-{seed}" for seed in record["seeds"]]
    losses = record["budgets"][1]["arms"][best]["select_loss"]["1"]
    unit = prune_dir / "keep-0.5" / best / "seed-1"
    assert selection_losses(tmp_path, unit / "model") == pytest.approx(losses, rel=1e-5)
    again = invoke("prune", str(spec))
    assert "exported the recommended" not in again and "prune: up to date" in again


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        ({"export": ["best@0.5"]}, "exports the arm select recommends; add select"),
        ({"select": {"windows": 2}, "export": ["best@0.6"]}, "names keep 0.6"),
        (
            {"select": {"windows": 2},
             "arms": [{"name": "best", "schedule": {"kind": "uniform"}},
                      {"name": "uniform", "schedule": {"kind": "uniform"}}]},
            "arm name 'best' is taken",
        ),
    ],
)  # fmt: skip
def test_a_bad_best_export_in_a_spec_is_one_line(
    tmp_path: Path, changes: dict[str, object], said: str
) -> None:
    result = CliRunner().invoke(cli, ["validate", str(prune_spec(tmp_path, **changes))])
    assert result.exit_code == 2, result.output
    assert said in " ".join(result.output.split())


# -- what the recommended model ships as, before anything is exported --------------------------


def files_bytes(directory: Path, pattern: str = "*.safetensors") -> int:
    return sum(os.path.getsize(path) for path in directory.glob(pattern))


def test_what_to_ship_gives_the_bytes_of_the_safetensors_the_export_writes(
    selected: Path, tmp_path: Path
) -> None:
    """From a checkpoint directory: per keep fraction the recommended model's safetensors bytes
    are those of the files --export best@KEEP writes (os.path.getsize); no GGUF size, the
    reason said, in prune.json, the keep fraction's shipped.json and the report's line."""
    from geospec.prune.shipped import NO_GGUF
    from geospec.storage.digests import unsealed

    run = selected / "run"
    record = json.loads((run / "prune.json").read_text())
    report = (run / "prune" / "report.md").read_text()
    for budget in record["budgets"]:
        keep, shipped = f"{budget['keep']:g}", budget["recommended"]["shipped"]
        out = tmp_path / f"best-{keep}"
        invoke("prune", str(selected / "spec.toml"), "--export", f"best@{keep}", "--to", str(out))
        assert shipped["safetensors_bytes"] == files_bytes(out) > 0
        assert (shipped["arm"], shipped["seed"]) == (budget["recommended"]["arm"], 0)
        assert shipped["gguf"] == {"skipped": "the reference is not a GGUF file: no source "
                                   "file to compare one with"}  # fmt: skip
        assert shipped["speed"] == {"skipped": NO_GGUF}
        stored = json.loads((run / "prune" / f"keep-{keep}" / "shipped.json").read_text())
        assert unsealed(stored) == shipped
        size = f"{files_bytes(out) / 1024:.1f} KiB"
        assert f"as files (calibration seed 0's cut): safetensors {size} (float32); no GGUF " in (
            report
        )
        assert f"--format gguf --to {shipped['arm']}-{keep}.gguf`" in report


def gguf_prune_spec(directory: Path, **prune: object) -> Path:
    """A prune of the tiny Qwen2 written as a Q8_0 GGUF file (its 400-token BPE inside, as
    llama.cpp's converter writes one): three arms, one calibration seed, keep 0.5, select on
    two windows; ``prune`` changes the [prune] table."""
    import gguf_models
    import test_qwen2

    tokenizer = directory / "tokenizer"
    if not (directory / "q.gguf").exists():
        gguf_models.bpe_tokenizer(tokenizer)
        model = test_qwen2.qwen2(vocab=gguf_models.VOCAB)
        gguf_models.qwen2_gguf(directory / "q.gguf", model, tokenizer, q8_0=True)
    spec = test_qwen2.prune_spec(directory)
    data = tomlkit.parse(spec.read_text())
    data["reference"]["checkpoint"] = "q.gguf"  # type: ignore[index]
    table = data["prune"]
    table["arms"] = table["arms"][:3]  # type: ignore[index]
    table["select"] = {"windows": 2}  # type: ignore[index]
    table.update(prune)  # type: ignore[union-attr]
    spec.write_text(tomlkit.dumps(data))
    return spec


def no_llama_cpp(patch: pytest.MonkeyPatch) -> None:
    """llama-cpp-python made absent (a None in sys.modules blocks an import): gguf-py writes the
    GGUF file and nothing is timed, as on a machine without it."""
    patch.setitem(sys.modules, "llama_cpp", None)


@pytest.fixture(scope="module")
def from_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The GGUF prune, export = false (the recommended model is written to a temporary
    directory to be measured), without llama-cpp-python."""
    pytest.importorskip("gguf")
    directory = tmp_path_factory.mktemp("from-gguf")
    with pytest.MonkeyPatch.context() as patch:
        no_llama_cpp(patch)
        output = invoke("prune", str(gguf_prune_spec(directory, export=False)))
    (directory / "output.txt").write_text(output)
    return directory


@pytest.mark.gguf
def test_what_to_ship_gives_the_sizes_of_the_files_the_export_writes(
    from_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From a Q8_0 GGUF file, with export = false: the recorded GGUF bytes are the size of the
    file `--export best@0.5 --format gguf --to ARM-0.5.gguf` writes (the name the report gives),
    its f16 bytes the size of the same export in f16, the source's its file's, the safetensors
    bytes those of `--export best@0.5 --to DIR`; no file is left behind, the export reuses the
    record, and the report says it all in one line."""
    no_llama_cpp(monkeypatch)
    run, spec = from_gguf / "run", str(from_gguf / "spec.toml")
    record = json.loads((run / "prune.json").read_text())
    shipped = record["budgets"][0]["recommended"]["shipped"]
    arm = record["budgets"][0]["recommended"]["arm"]
    assert "measuring what the recommended" in (from_gguf / "output.txt").read_text()
    stored = (run / "prune" / "keep-0.5" / "shipped.json").read_bytes()
    assert not list((run / "prune").rglob(".shipping-*"))
    assert not list((run / "prune").glob("keep-0.5/*/seed-*/model"))  # export = false
    target = tmp_path / "q8" / f"{arm}-0.5.gguf"
    target.parent.mkdir()
    output = invoke("prune", spec, "--export", "best@0.5", "--format", "gguf", "--to", str(target))
    assert "measuring what the recommended" not in output  # the record is reused
    assert (run / "prune" / "keep-0.5" / "shipped.json").read_bytes() == stored
    f16 = tmp_path / "f16" / target.name
    f16.parent.mkdir()
    args = ["--export", "best@0.5", "--format", "gguf", "--dtype", "f16", "--to", str(f16)]
    invoke("prune", spec, *args)
    directory = tmp_path / "hf"
    invoke("prune", spec, "--export", "best@0.5", "--to", str(directory))
    import gguf

    matrices = [t for t in gguf.GGUFReader(str(target)).tensors if len(t.shape) == 2]
    ffn = Counter(t.tensor_type.name for t in matrices if ".ffn_" in t.name)
    fell = Counter(
        t.tensor_type.name for t in matrices if ".ffn_" in t.name and int(t.shape[0]) % 32
    )
    assert shipped["gguf"] == {
        "file": target.name,
        "type": "Q8_0",
        "quantizer": "gguf-py",
        "bytes": os.path.getsize(target),
        "source_bytes": os.path.getsize(from_gguf / "q.gguf"),
        "source_type": "Q8_0",
        "f16_bytes": os.path.getsize(f16),
        "block": 32,
        "matrices": dict(Counter(t.tensor_type.name for t in matrices)),
        "ffn_matrices": dict(ffn),
        "ffn_fallbacks": dict(fell),  # rows not whole blocks of 32: the spec's grid is 8
        # the source file in the same type: its FFN matrices' fallbacks, read from it
        "source_ffn_fallbacks": dict(
            Counter(
                t.tensor_type.name
                for t in gguf.GGUFReader(str(from_gguf / "q.gguf")).tensors
                if len(t.shape) == 2 and ".ffn_" in t.name and int(t.shape[0]) % 32
            )
        ),
    }
    # scored as shipped: the float32 model on the selection windows is the unit's own
    # select_loss (the prune's forward passes, float32), the file's weights beside it
    score, seed = shipped["score"], str(record["seeds"][0])
    own = record["budgets"][0]["arms"][arm]["select_loss"][seed]
    assert score["windows"] == len(own) == 2
    assert score["float32"] == pytest.approx(sum(own) / len(own), abs=1e-5)
    assert score["difference"] == pytest.approx(score["shipped"] - score["float32"])
    assert abs(score["difference"]) < 0.05  # Q8_0: within the width of 8-bit rounding
    assert shipped["safetensors_bytes"] == files_bytes(directory) > 0
    assert shipped["speed"] == {"skipped": "llama-cpp-python is not installed"}
    from geospec.storage.disk import size

    ratio = os.path.getsize(target) / os.path.getsize(from_gguf / "q.gguf")
    report = (run / "prune" / "report.md").read_text()
    difference = score["difference"]
    assert (
        f"GGUF (Q8_0) {size(os.path.getsize(target))}, {ratio:.2f}x the source's "
        f"{size(os.path.getsize(from_gguf / 'q.gguf'))} (Q8_0); FFN matrices "
        f"{', '.join(f'{n} {kind}' for kind, n in sorted(ffn.items()))}"
    ) in report
    assert (
        f"scored as shipped (the GGUF file's weights) {abs(difference):.4f} nats "
        f"{'above' if difference >= 0 else 'below'} the float32 model on the 2 selection "
        "windows"
    ) in report
    assert "; no llama.cpp speed (llama-cpp-python is not installed)" in report
    assert ratio < 1


def test_what_to_ship_tells_the_fallbacks_beside_the_source_files() -> None:
    """Qwen2.5-Coder-0.5B's d_model of 896 is not whole blocks of 256: its gate and up
    projections fall back in the source Q4_K_M file as in any export of it, so What to ship
    gives the source's count beside the export's (an older record without it: the export's)."""
    from geospec.report.prune import _stored_words

    record = {
        "ffn_matrices": {"Q4_K": 12, "Q5_0": 48, "Q6_K": 12},
        "ffn_fallbacks": {"Q5_0": 48},
        "block": 256,
        "source_ffn_fallbacks": {"Q5_0": 48},
    }
    words = _stored_words(record)
    assert words.endswith("48 fell back (48 to Q5_0), their rows not whole blocks of 256; "
                          "the source file's: 48")  # fmt: skip
    del record["source_ffn_fallbacks"]
    assert _stored_words(record).endswith("their rows not whole blocks of 256")


@pytest.mark.gguf
def test_the_record_is_reused_and_measured_again_when_what_it_measures_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rerun (prune.json lost) reuses shipped.json; another export dtype measures it again
    and recomputes no unit; another recommendation (the recommended arm removed) measures the
    new arm's model."""
    pytest.importorskip("gguf")
    no_llama_cpp(monkeypatch)
    spec = gguf_prune_spec(tmp_path, export=False)
    invoke("prune", str(spec))
    run = tmp_path / "run"
    path = run / "prune" / "keep-0.5" / "shipped.json"
    first = json.loads((run / "prune.json").read_text())["budgets"][0]["recommended"]
    stored = path.read_bytes()
    (run / "prune.json").unlink()
    output = invoke("prune", str(spec))
    assert "measuring what the recommended" not in output and path.read_bytes() == stored
    again = json.loads((run / "prune.json").read_text())["budgets"][0]["recommended"]
    assert again["shipped"] == first["shipped"]
    units = {p: p.stat().st_mtime_ns for p in (run / "prune").glob("keep-*/*/seed-*/result.json")}
    spec = gguf_prune_spec(tmp_path, export=False, export_dtype="bfloat16")
    output = invoke("prune", str(spec))
    assert f"measuring what the recommended {first['arm']}@0.5" in output
    assert {p: p.stat().st_mtime_ns for p in units} == units  # no unit computed again
    narrow = json.loads(path.read_text())
    assert narrow["key"] != first["shipped"]["key"] and narrow["export_dtype"] == "bfloat16"
    ratio = narrow["safetensors_bytes"] / first["shipped"]["safetensors_bytes"]
    assert 0.45 < ratio < 0.6  # two bytes a weight for four, the header aside
    assert narrow["gguf"]["bytes"] == first["shipped"]["gguf"]["bytes"]  # from the same shapes
    arms = [a for a in tomlkit.parse(spec.read_text())["prune"]["arms"]  # type: ignore[index]
            if a["name"] != first["arm"]]  # fmt: skip
    spec = gguf_prune_spec(tmp_path, export=False, arms=arms, baseline=arms[0]["name"])
    output = invoke("prune", str(spec))
    other = json.loads((run / "prune.json").read_text())["budgets"][0]["recommended"]
    assert other["arm"] != first["arm"] and f"recommended {other['arm']}@0.5 ships" in output
    assert json.loads(path.read_text())["arm"] == other["arm"] == other["shipped"]["arm"]


@pytest.mark.gguf
def test_select_shipped_recommends_on_the_gguf_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """prune.select.shipped: every unit's GGUF file (Q8_0, by gguf-py) is scored on the selection
    windows, the recommendation is the arm whose files have the lowest mean loss there, and
    the recommended model's own score as shipped (shipped.json, computed apart) is its seed's
    mean; each unit's losses are sealed in its directory and reused, and a damaged one is named
    and scored again to the same losses."""
    pytest.importorskip("gguf")
    no_llama_cpp(monkeypatch)
    invoke("prune", str(gguf_prune_spec(tmp_path, export=False)))
    run = tmp_path / "run"
    units = {p: p.stat().st_mtime_ns for p in (run / "prune").glob("keep-*/*/seed-*/result.json")}
    spec = gguf_prune_spec(tmp_path, export=False, select={"windows": 2, "shipped": True})
    output = invoke("prune", str(spec))
    assert "prune: scoring the 3 GGUF files at keep 0.5 (select.shipped)" in output
    assert {p: p.stat().st_mtime_ns for p in units} == units  # turned on: no unit recomputed
    record = json.loads((run / "prune.json").read_text())
    budget = record["budgets"][0]
    chosen, arms = budget["recommended"], budget["arms"]
    assert chosen["on"] == "shipped"
    means = {
        name: sum(arm["shipped_select_loss"]["0"]) / 2 for name, arm in arms.items()
    }  # one seed, two windows
    assert chosen["arm"] == min(means, key=lambda name: (means[name], name))
    for arm in arms.values():  # Q8_0: each file within 8-bit rounding of its float32 model
        for ours, theirs in zip(arm["shipped_select_loss"]["0"], arm["select_loss"]["0"],
                                strict=True):  # fmt: skip
            assert abs(ours - theirs) < 0.05
    score = chosen["shipped"]["score"]
    assert score["shipped"] == pytest.approx(means[chosen["arm"]], abs=1e-5)
    assert (
        "(prune.select.shipped), not its float32 model's"
        in (run / "prune" / "report.md").read_text()
    )
    sealed = sorted((run / "prune").glob("keep-0.5/*/seed-0/shipped_loss.json"))
    assert len(sealed) == 3 and not list((run / "prune").rglob(".shipping-*"))
    stamps = {path: path.stat().st_mtime_ns for path in sealed}
    (run / "prune.json").unlink()
    sealed[0].write_text(sealed[0].read_text()[:20])  # cut short
    output = invoke("prune", str(spec))
    unit = sealed[0].parent.relative_to(run / "prune")
    said = f"! prune: prune/{unit}/shipped_loss.json is unreadable; scoring its GGUF file again"
    assert said in output
    assert all(path.stat().st_mtime_ns == stamps[path] for path in sealed[1:])  # reused
    assert json.loads((run / "prune.json").read_text())["budgets"] == record["budgets"]
    output = invoke("prune", str(gguf_prune_spec(tmp_path, export=False)))  # turned off again
    assert "on" not in json.loads((run / "prune.json").read_text())["budgets"][0]["recommended"]
    assert {p: p.stat().st_mtime_ns for p in units} == units


def test_select_shipped_without_a_gguf_file_says_the_float32_models_chose(
    tmp_path: Path,
) -> None:
    """A reference that is no GGUF file has no file to score: the float32 models recommend, and
    prune.json and the report say why."""
    from test_prune import prune_spec

    arms = [{"name": "uniform", "schedule": {"kind": "uniform"}},
            {"name": "protect", "schedule": {"kind": "protect", "first": 1}}]  # fmt: skip
    spec = prune_spec(tmp_path, keep=0.5, arms=arms, export=False,
                      select={"windows": 2, "shipped": True},
                      calibration={"windows": 4, "seeds": [0]})  # fmt: skip
    output = invoke("prune", str(spec))
    assert "prune: select.shipped: float32: no GGUF file to score" in output
    chosen = json.loads((tmp_path / "run" / "prune.json").read_text())["budgets"][0]["recommended"]
    assert chosen["on"].startswith("float32: no GGUF file to score (the reference is not a GGUF")
    assert "but the float32 models' chose" in (tmp_path / "run" / "prune" / "report.md").read_text()


def test_the_report_says_the_share_a_budget_keeps_where_the_grid_moved_it() -> None:
    """Qwen2.5-Coder-1.5B's 28 layers of 8,960 at keep 0.5 on a grid of 256: a uniform width of
    4,608, so the budget keeps 129,024 neurons, 0.514 of them; on the grid keep is kept as is."""
    from geospec.report.prune import _share

    prune = {"layers": 28, "width": 8960}
    assert _share(prune, {"keep": 0.5, "budget": 28 * 4608}) == ", 0.514 on the width grid"
    assert _share(prune, {"keep": 0.5, "budget": 28 * 4480}) == ""
