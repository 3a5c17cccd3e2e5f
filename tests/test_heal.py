"""``geospec heal``: only the model a prune ships is healed, by distillation from the unpruned
model, and exported like any other; its time is estimated from its parameters."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import tomlkit
import torch
from click.testing import CliRunner
from test_prune import PRUNE_SPEC, invoke, prune_spec

import geospec
from geospec.cli import cli


def heal_spec(directory: Path, **changes: object) -> Path:
    return prune_spec(
        directory, arms=PRUNE_SPEC["arms"][:2], keep=0.5, export=False,
        calibration={"windows": 8, "seeds": [0]}, select={"windows": 4},
        **changes,
    )  # fmt: skip


def files_of(directory: Path) -> dict[Path, int]:
    return {p: p.stat().st_mtime_ns for p in directory.rglob("*") if p.is_file()}


def test_heal_distils_only_the_recommended_model_and_exports_the_healed_one(
    tmp_path: Path,
) -> None:
    """best@0.5: the prune runs, the arm it recommends alone is healed (distilled from the
    unpruned model: its training's fingerprint names the teacher at weight 1), and the export
    is the healed model: plain transformers reads it and computes the engine's healed logits.
    Its perplexities before and after are the recorded unhealed loss and the healed model's
    loss on the eval windows. A second heal reuses the healing and trains nothing."""
    from geospec.engine.checkpoint import load_model

    spec = heal_spec(tmp_path)
    output = invoke("heal", str(spec), "best@0.5", "--steps", "3", "--to", str(tmp_path / "out"))
    run = tmp_path / "run"
    record = json.loads((run / "prune.json").read_text())
    chosen = record["budgets"][0]["recommended"]["arm"]
    units = {p.parent.name: p for p in (run / "prune" / "keep-0.5").glob("*/seed-0")}
    assert set(units) == {"uniform", "flap"}
    for arm, unit in units.items():
        assert (unit / "healed").exists() == (arm == chosen)
        assert not (unit / "heal").exists()  # no [prune.heal]: the prune healed nothing
    healed_dir = units[chosen] / "healed"
    trained = json.loads((healed_dir / "train" / "result.json").read_text())
    assert trained["fingerprint"]["teacher"]["weight"] == 1.0
    assert f"heal: {chosen}@0.5 (seed 0), 3 steps of 8 x 16 tokens, distilled" in output
    engine = load_model(healed_dir / "train")
    exported = geospec.load_pruned(tmp_path / "out").eval()
    ids = torch.randint(0, 40, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected, _ = engine(ids)
        got = exported(input_ids=ids).logits
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    before = record["budgets"][0]["arms"][chosen]["loss"]["docs.jsonl"]["0"]
    after = json.loads((healed_dir / "result.json").read_text())["healed_loss"]["docs.jsonl"]
    assert after != pytest.approx(before, abs=1e-4)  # lr 1e-4 over 3 steps moves it
    line = next(line for line in output.splitlines() if line.startswith("healed "))
    assert f"docs.jsonl {math.exp(before):.2f} -> {math.exp(after):.2f}" in line
    assert f"(unpruned {math.exp(record['reference']['docs.jsonl']):.2f})" in line
    printed = continuations_printed(output)
    assert printed == greedy_texts(tmp_path / "model", units[chosen] / "model", tmp_path / "out")
    kept = files_of(healed_dir)
    again = invoke("heal", str(spec), "best@0.5", "--steps", "3", "--to", str(tmp_path / "b"))
    assert f"healed {chosen}@0.5 (seed 0) (reused)" in again and files_of(healed_dir) == kept
    assert continuations_printed(again) == printed  # kept in healed/result.json
    # the unhealed model's selection loss the advice on a file's type reads: prune.json's
    # record of the recommended unit's selection windows, averaged
    from rich.console import Console

    from geospec.pipeline.healing import heal_exported
    from geospec.prune.units import Unit
    from geospec.spec.loading import load_spec

    reused = heal_exported(load_spec(spec, ()), spec, run, Unit(0.5, chosen, 0), 3, Console())
    windows = record["budgets"][0]["arms"][chosen]["select_loss"]["0"]
    assert not reused.now and reused.before_select == pytest.approx(sum(windows) / len(windows))
    assert (tmp_path / "b" / "config.json").read_text() == (
        tmp_path / "out" / "config.json"
    ).read_text()


def continuations_printed(output: str) -> dict[str, tuple[str, str]]:
    """geospec heal's continuation lines: each prompt's text before healing and healed."""
    lines = output.splitlines()
    start = lines.index("greedy continuations of fixed prompts (no decision reads them):")
    found = {}
    for at in range(start + 1, len(lines) - 2, 3):
        if not lines[at].startswith("- `"):
            break
        before, after = (re.fullmatch(r"  - [a-z ]+: `(.*)`", lines[at + k]) for k in (1, 2))
        assert before is not None and after is not None
        found[lines[at][3:-1]] = (before.group(1), after.group(1))
    return found


def greedy_texts(checkpoint: Path, unhealed: Path, healed: Path) -> dict[str, tuple[str, str]]:
    """transformers' own greedy generate of each fixed prompt by the two models, decoded by the
    checkpoint's tokenizer (independent of geospec's loop)."""
    from transformers import AutoTokenizer

    from geospec.prune.continuations import CONTINUATION_TOKENS
    from geospec.prune.select import PROMPTS

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    models = [geospec.load_pruned(unhealed).eval(), geospec.load_pruned(healed).eval()]
    found = {}
    for prompt in PROMPTS:
        ids = torch.tensor([tokenizer(prompt, add_special_tokens=False).input_ids])
        texts = []
        for model in models:
            out = model.generate(ids, max_new_tokens=CONTINUATION_TOKENS, do_sample=False)
            text = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
            texts.append(" ".join(text.split()))
        found[prompt] = (texts[0], texts[1])
    return found


def test_a_vanishing_learning_rate_heals_to_the_pruned_model_and_a_damaged_record_is_redone(
    tmp_path: Path,
) -> None:
    """At lr 1e-12 the healed model is the pruned one (the import and the way back are exact),
    its loss the unit's own; a healing record changed after it was written is not trusted: the
    model is written again from the finished training, which is not redone."""
    spec = heal_spec(tmp_path, heal={"lr": 1e-12})
    invoke("heal", str(spec), "flap@0.5", "--steps", "2", "--to", str(tmp_path / "out"))
    unit = tmp_path / "run" / "prune" / "keep-0.5" / "flap" / "seed-0"
    stored = json.loads((unit / "result.json").read_text())["loss"]
    record_path = unit / "healed" / "result.json"
    healed = json.loads(record_path.read_text())["healed_loss"]
    for corpus, loss in stored.items():
        assert healed[corpus] == pytest.approx(loss, abs=1e-5)
    training = files_of(unit / "healed" / "train")
    damaged = json.loads(record_path.read_text())
    damaged["healed_loss"]["docs.jsonl"] -= 1.0
    record_path.write_text(json.dumps(damaged))
    output = invoke("heal", str(spec), "flap@0.5", "--steps", "2", "--to", str(tmp_path / "b"))
    assert "(reused)" not in output
    assert json.loads(record_path.read_text())["healed_loss"] == pytest.approx(healed)
    assert files_of(unit / "healed" / "train") == training  # the finished training reused


@pytest.mark.parametrize(
    ("change", "args", "said"),
    [
        ({"heal": {"steps": 2}}, [], "heals every pruned model in the prune already"),
        ({}, ["--to", "TO", "--padded", "--format", "gguf"], "--padded is for --format hf"),
        ({}, ["--format", "gguf", "--to", "TO/m"], "a GGUF file's name ends in .gguf"),
        ({}, ["--steps", "0"], "0 is not in the range x>=1"),
    ],
)
def test_heal_refuses_what_it_cannot_do_in_one_line(
    tmp_path: Path, change: dict[str, object], args: list[str], said: str
) -> None:
    spec = heal_spec(tmp_path, **change)
    given = [a.replace("TO", str(tmp_path / "out")) for a in args]
    if "--to" not in given:
        given += ["--to", str(tmp_path / "out")]
    result = CliRunner().invoke(cli, ["heal", str(spec), "best@0.5", *given])
    assert result.exit_code == 2, result.output
    assert said in result.output and "Traceback" not in result.output
    assert not (tmp_path / "run").exists()  # refused before anything ran


def test_the_time_estimate_counts_a_real_training_steps_operations() -> None:
    """healing_time's operations per token, 6 per pruned parameter (a training step) and 2 per
    unpruned parameter (the teacher's forward pass), against torch's own count of a distilling
    step of a Llama model imported into the engine (attention's share aside: a few percent)."""
    from hf_models import llama
    from torch.utils.flop_counter import FlopCounterMode

    from geospec.engine.imported import import_llama
    from geospec.shapes.heal_time import healing_time

    seq_len, batch = 16, 2
    teacher = import_llama(llama(intermediate_size=256), seq_len)
    student = import_llama(llama(intermediate_size=128), seq_len)
    ids = torch.randint(0, 40, (batch, seq_len))
    counter = FlopCounterMode(display=False)
    with counter:
        with torch.no_grad():
            teacher(ids)
        logits, _ = student(ids)
        logits.float().pow(2).mean().backward()
    counted = counter.get_total_flops()
    # the engine's parameters, each tied matrix once: the head's matmul is counted, the
    # embedding's lookup is not an operation
    pruned = sum(p.numel() for p in student.parameters())
    unpruned = sum(p.numel() for p in teacher.parameters())
    estimate = healing_time(pruned, unpruned, 1, batch, seq_len, distill=True)
    assert estimate.flops == pytest.approx(counted, rel=0.15)
    assert estimate.tokens == batch * seq_len


def test_validate_and_what_to_ship_say_how_long_healing_takes(tmp_path: Path) -> None:
    """validate, for a spec that recommends a model, says what geospec heal costs it at the
    default steps (and, with [prune.heal], what the prune's healing costs); What to ship's
    advice to heal names the command and the same kind of estimate."""
    from geospec.shapes.heal_time import CPU_MEASURED, DEFAULT_STEPS, QUIET_MEASURED

    spec = heal_spec(tmp_path)
    output = invoke("validate", str(spec))
    line = next(line for line in output.splitlines() if line.startswith("time of healing"))
    assert f"{DEFAULT_STEPS} steps of 8 x 16 tokens" in line and "geospec heal" in line
    data = tomlkit.parse(spec.read_text())
    data["prune"]["heal"] = {"steps": 7, "batch_size": 2}  # type: ignore[index]
    spec.write_text(tomlkit.dumps(data))
    output = invoke("validate", str(spec))
    line = next(line for line in output.splitlines() if line.startswith("time of healing"))
    assert "7 steps of 2 x 16 tokens" in line and "2 pruned models" in line
    assert re.search(rf"about \d+ s on {QUIET_MEASURED}, \d+ s on {CPU_MEASURED}", line)


def test_what_to_ships_advice_names_geospec_heal_with_its_time(tmp_path: Path) -> None:
    """The advice to heal names ``geospec heal SPEC best@KEEP`` and its time at the default
    steps, counted from the exported model's own parameters (each tied matrix once) and the
    unpruned checkpoint's, at the spec's sequence length; What to ship is printed once."""
    import transformers as hf

    from geospec.report.prune import heal_command, what_to_ship
    from geospec.shapes.heal_time import DEFAULT_STEPS, healing_time

    spec = heal_spec(tmp_path)
    output = invoke("prune", str(spec), "--export", "best@0.5", "--to", str(tmp_path / "out"))
    assert output.count("## What to ship") == 1
    record = json.loads((tmp_path / "run" / "prune.json").read_text())
    arm = record["budgets"][0]["recommended"]["arm"]
    pruned = sum(p.numel() for p in geospec.load_pruned(tmp_path / "out").parameters())
    unpruned = hf.AutoModelForCausalLM.from_pretrained(tmp_path / "model").num_parameters()
    took = healing_time(pruned, unpruned, DEFAULT_STEPS, 8, 16, distill=True)
    advice = heal_command(record, 0.5, arm)
    assert advice.startswith(f"`geospec heal SPEC best@0.5 --format gguf --to {arm}-0.5-healed")
    assert took.describe() in advice
    record["select_reference"] = -10.0  # far below any arm's: the advice to heal is given
    assert f"**heal it before use**: {advice}" in "\n".join(what_to_ship(record))


@pytest.mark.gguf
def test_the_healed_model_ships_as_a_gguf_file_with_the_healed_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From a Qwen2 GGUF reference (its attention biases carried through healing), --format
    gguf --dtype f32: the file gguf-py reads holds the healed model's FFN weights at the true
    widths, not the unhealed unit's, and scored as shipped (its own weights) it has the healed
    model's perplexities, nothing rounded away."""
    pytest.importorskip("gguf")
    from gguf import GGUFReader
    from test_select import gguf_prune_spec, no_llama_cpp

    no_llama_cpp(monkeypatch)
    spec = gguf_prune_spec(tmp_path, export=False)
    target = tmp_path / "healed.gguf"
    output = invoke("heal", str(spec), "best@0.5", "--steps", "2", "--format", "gguf",
                    "--dtype", "f32", "--to", str(target))  # fmt: skip
    assert "exported GGUF f32 (as asked" in output
    record = json.loads((tmp_path / "run" / "prune.json").read_text())
    arm = record["budgets"][0]["recommended"]["arm"]
    unit = tmp_path / "run" / "prune" / "keep-0.5" / arm / "seed-0"
    healed = geospec.load_pruned(unit / "healed" / "model").eval()
    unhealed = geospec.load_pruned(unit / "model").eval()
    tensors = {t.name: t for t in GGUFReader(target).tensors}
    for index, layer in enumerate(healed.model.layers):
        stored = torch.from_numpy(tensors[f"blk.{index}.ffn_down.weight"].data.copy()).float()
        weight = layer.mlp.down_proj.weight.detach().float()
        assert stored.shape == weight.shape
        torch.testing.assert_close(stored, weight)
        assert not torch.equal(stored, unhealed.model.layers[index].mlp.down_proj.weight.float())
    after = json.loads((unit / "healed" / "result.json").read_text())["healed_loss"]
    shipped = next(line for line in output.splitlines() if line.startswith("as shipped"))
    assert shipped.startswith("as shipped (healed.gguf's own F32 weights): perplexity ")
    for corpus, loss in after.items():
        assert f"{corpus} {math.exp(loss):.2f}" in shipped
    assert "on the selection windows 0.000 nats above the healed model" in shipped
    assert "--dtype" not in shipped


@pytest.mark.parametrize(
    ("shipped", "kind", "advised"),
    [
        (3.0, "Q4_1", False),  # the healed model's own loss: nothing lost
        (3.45, "Q4_1", False),  # 0.45 of the 1.0 nats gained: under half
        (3.55, "Q4_1", True),  # 0.55 of them: the larger types are named
        (3.55, "F16", False),  # no larger type to name
    ],
)
def test_the_shipped_line_names_a_larger_type_where_the_file_rounds_away_most_healing(
    shipped: float, kind: str, advised: bool
) -> None:
    """On the selection windows, the file's loss above the healed model's against what healing
    gained there (the unhealed unit's selection loss, as its unit records it, less the healed
    model's); a larger type is named exactly where the first exceeds half the second. The eval
    perplexities are shown; without a selection there is no advice."""
    from geospec.cli.heal import shipped_words
    from geospec.pipeline.healing import ShippedFile

    unhealed = 4.0  # the unhealed model's selection loss (read from its unit: the test above)
    scored = ShippedFile({"x": 2.0, "y": 1.0}, {"float32": 3.0, "shipped": shipped})
    line = shipped_words(Path("f.gguf"), kind, scored, unhealed, {"x": "X"})
    assert f"perplexity X {math.exp(2.0):.2f}, y {math.exp(1.0):.2f};" in line
    above = shipped - 3.0
    said = f"on the selection windows {above:.3f} nats above the healed model, where healing"
    assert f"{said} gained 1.000" in line
    assert ("--dtype q5_1 or q8_0" in line) == advised
    if advised:
        assert f"rounds away {above:.0%} of the healing" in line
    alone = shipped_words(Path("f.gguf"), kind, ShippedFile({"x": 2.0}, None), None, {})
    assert "no [prune] select" in alone and "--dtype" not in alone


def test_a_llama_refit_with_its_intercept_heals_where_layers_are_kept_whole(
    tmp_path: Path,
) -> None:
    """Issue 54 on a Llama: the first and last layers kept whole, the middle one re-fitted with
    its intercept, [prune.heal] on. The prune heals the unit (it used to stop at the import:
    the whole layers had no down bias), and the unit's model/ is the healed model as a Llama
    with mlp_bias, every down bias the healed one: it computes the engine's healed logits."""
    from test_bias_export import family_spec

    from geospec.engine.checkpoint import load_model

    arms = [{"name": "ends", "schedule": {"kind": "protect", "first": 1, "last": 1},
             "repair": "lstsq"}]  # fmt: skip
    spec = family_spec(tmp_path, "llama", arms=arms, baseline="ends", keep=0.75,
                       heal={"steps": 2, "lr": 0.01, "batch_size": 2})  # fmt: skip
    output = invoke("prune", str(spec))
    unit = tmp_path / "run" / "prune" / "keep-0.75" / "ends" / "seed-0"
    record = json.loads((unit / "result.json").read_text())
    assert record["widths"] == [64, 16, 64], output
    assert record["healed_loss"]["docs.jsonl"] != record["loss"]["docs.jsonl"]
    healed = load_model(unit / "heal")
    assert healed.config.ffn_out_bias
    exported = geospec.load_pruned(unit / "model")
    assert exported.config.model_type == "llama" and exported.config.mlp_bias
    for index, layer in enumerate(exported.model.layers):
        trained = healed.state_dict()[f"blocks.{index}.ffn.proj.bias"]
        torch.testing.assert_close(layer.mlp.down_proj.bias.detach(), trained)
        assert trained.any()  # the zero bias of a layer kept whole trained too
    ids = torch.randint(0, 40, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected, _ = healed(ids)
        got = exported(input_ids=ids).logits
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
