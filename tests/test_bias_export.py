"""A re-fit with its intercept (or mean compensation) adds a bias to the FFN output projection,
which Qwen2's and Gemma 3's transformers MLP cannot hold: said before the prune runs, read from
the checkpoint's own config.json. An export that asks for such a model explicitly is refused
(exit 2, the spec file, the field and the fix); What to ship's files of a recommended model
that could be one, and export = ["best@KEEP"], are a warning: the prune still runs and scores.
Tiny checkpoints of each family are built here with transformers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import hf_models
import pytest
import tomlkit
from click.testing import CliRunner, Result
from test_prune import word_corpus

from geospec.cli import cli

pytestmark = [pytest.mark.torch]

#: Each family's builder and its config.json model_type (what validate reads).
FAMILIES: dict[str, tuple[Callable[[], object], str]] = {
    "qwen2": (hf_models.qwen2, "qwen2"),
    "gemma3": (hf_models.gemma3, "gemma3_text"),
    "llama": (lambda: hf_models.llama(intermediate_size=64), "llama"),
}
ARMS = [
    {"name": "uniform", "schedule": {"kind": "uniform"}},
    {"name": "refit", "schedule": {"kind": "uniform"}, "repair": "lstsq"},
]


def family_spec(directory: Path, family: str, **prune: object) -> Path:
    """A prune spec of a tiny checkpoint of ``family`` (its shape read from its config.json)
    with a plain arm and a re-fit with its intercept (the default)."""
    build, _ = FAMILIES[family]
    if not (directory / "model").exists():
        hf_models.save_with_words(build(), directory / "model")  # type: ignore[arg-type]
    word_corpus(directory / "docs.jsonl", 0)
    spec = {
        "name": family,
        "out": str(directory / "run"),
        "model": {"seq_len": 16, "multiple_of": 8},
        "data": {"files": ["docs.jsonl"], "tokenizer": {"kind": "pretrained", "path": "model"}},
        "reference": {"checkpoint": "model"},
        "probe": {"tokens": 64},
        "prune": {"keep": 0.5, "calibration": {"windows": 4, "seeds": [0]},
                  "eval": {"corpora": ["docs.jsonl"], "windows": 2}, "arms": ARMS} | prune,
    }  # fmt: skip
    path = directory / "spec.toml"
    path.write_text(tomlkit.dumps(spec))
    return path


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def warnings_of(output: str) -> list[str]:
    return [" ".join(line.split()) for line in output.split("warning:")[1:]]


@pytest.mark.parametrize("family", ["qwen2", "gemma3"])
def test_validate_warns_when_the_recommended_arm_could_be_a_refit_the_family_cannot_hold(
    tmp_path: Path, family: str
) -> None:
    spec = family_spec(tmp_path, family, export=["best@0.5"], select={"windows": 2})
    result = run("validate", str(spec))
    assert result.exit_code == 0, result.output
    (warning,) = warnings_of(result.output.split("is valid")[0])
    model_type = FAMILIES[family][1]
    assert warning.startswith("prune.select: if the recommended arm is refit")
    assert 'export = ["best@0.5"] fails' in warning
    assert f"transformers' {model_type} MLP has no bias" in warning
    assert f"config.json of {tmp_path / 'model'}" in warning
    assert "lstsq = { intercept = false }" in warning
    # geospec run says it too, first (here it stops after loading the reference)
    started = run("run", str(spec), "--until", "reference")
    assert started.exit_code == 0, started.output
    assert started.output.startswith("warning: prune.select: if the recommended arm is refit")
    # the fix named is the fix: no warning once the re-fit has no intercept
    quiet = run("validate", str(spec), "--set", "prune.lstsq.intercept=false")
    assert quiet.exit_code == 0 and "warning:" not in quiet.output
    # nor without What to ship, which is what would write the recommended model
    plain = family_spec(tmp_path, family, export=False)
    assert "warning:" not in run("validate", str(plain)).output


def test_a_llama_holds_the_refit_bias_and_is_not_warned_about(tmp_path: Path) -> None:
    spec = family_spec(tmp_path, "llama", export=["best@0.5", "refit@0.5"], select={"windows": 2})
    result = run("validate", str(spec))
    assert result.exit_code == 0, result.output
    assert "warning:" not in result.output


@pytest.mark.parametrize("family", ["qwen2", "gemma3"])
def test_an_explicit_export_of_a_refit_with_an_intercept_is_refused_before_anything_runs(
    tmp_path: Path, family: str
) -> None:
    """In the spec (validate and prune) and as --export ARM@KEEP (prune, before any stage): one
    line naming the spec file, the field and the fix, exit 2; no run directory is made."""
    spec = family_spec(tmp_path, family, export=["refit@0.5"])
    model_type = FAMILIES[family][1]
    for command in ("validate", "prune"):
        result = run(command, str(spec))
        assert result.exit_code == 2 and "Traceback" not in result.output
        said = " ".join(result.output.split())
        assert str(spec) in said and 'prune.repair: "lstsq" on refit' in said
        assert f"{model_type} MLP has no bias" in said and "intercept = false" in said
    spec = family_spec(tmp_path, family, export=False)
    result = run("prune", str(spec), "--export", "refit@0.5", "--to", str(tmp_path / "out"))
    assert result.exit_code == 2 and "Traceback" not in result.output
    said = " ".join(result.output.split())
    assert "--export refit@0.5: refit's repair ('lstsq') adds a bias" in said
    assert f"{model_type} MLP has no bias" in said and "lstsq = { intercept = false }" in said
    assert not (tmp_path / "run").exists() and not (tmp_path / "out").exists()
    # the unrepaired arm's export is not refused (here only checked up to the spec: validate)
    assert (
        run("validate", str(family_spec(tmp_path, family, export=["uniform@0.5"]))).exit_code == 0
    )


def test_prune_says_it_at_its_start_and_still_prunes_and_scores(tmp_path: Path) -> None:
    """Both arms re-fitted with their intercept, so the recommendation is one of them: the
    warning is the first thing geospec prune says; every unit is computed and scored, and What
    to ship records the recommended model as unexportable. --export best@KEEP is warned about at
    the start and refused (exit 2, one line) once the prune has chosen, its units reused."""
    import json

    from test_qwen2 import prune_spec  # a tiny Qwen2 with a BPE tokenizer, on prose

    arms = [ARMS[1], {**ARMS[1], "name": "refit-ends", "schedule": {"kind": "protect", "first": 1}}]
    spec = prune_spec(tmp_path, arms=arms, baseline="refit", export=False,
                      select={"windows": 2, "runtime": False})  # fmt: skip
    result = run("prune", str(spec))
    assert result.exit_code == 0, result.output + repr(result.exception)
    first = result.output.strip().splitlines()[0]
    assert first.startswith("warning: prune.select: if the recommended arm is refit or refit-ends")
    record = json.loads((tmp_path / "run" / "prune.json").read_text())
    budget = record["budgets"][0]
    assert set(budget["arms"]) == {"refit", "refit-ends"}
    assert "qwen2 MLP has no bias" in budget["recommended"]["shipped"]["unexportable"]
    chosen = budget["recommended"]["arm"]
    result = run("prune", str(spec), "--export", "best@0.5", "--to", str(tmp_path / "best"))
    assert result.exit_code == 2 and "Traceback" not in result.output
    said = " ".join(result.output.split())
    assert said.startswith("warning:") and "and --export best@0.5 fails" in said.split("✓")[0]
    assert f"--export {chosen}@0.5: {chosen}'s repair ('lstsq') adds a bias" in said
    assert "pruned models" not in said  # the units were reused, none computed again
    assert not (tmp_path / "best").exists()


@pytest.mark.gguf
def test_select_shipped_on_a_qwen2_gguf_with_a_refit_is_refused(tmp_path: Path) -> None:
    """select.shipped writes every arm's GGUF file from its transformers checkpoint: with a
    re-fit that has its intercept on a Qwen2 GGUF (Q8_0, which gguf-py writes) none of that
    arm's files can be written, so the recommendation could never be made; the family is read
    from the file's metadata. Without select.shipped it is a warning."""
    import gguf_models
    from test_qwen2 import prune_spec, qwen2

    pytest.importorskip("gguf")
    gguf_models.bpe_tokenizer(tmp_path / "tokenizer")
    gguf_models.qwen2_gguf(tmp_path / "q.gguf", qwen2(vocab=gguf_models.VOCAB),
                           tmp_path / "tokenizer", q8_0=True)  # fmt: skip
    spec = prune_spec(tmp_path, arms=ARMS, export=False, select={"windows": 2, "shipped": True})
    data = tomlkit.parse(spec.read_text())
    data["reference"]["checkpoint"] = "q.gguf"  # type: ignore[index]
    spec.write_text(tomlkit.dumps(data))
    result = run("validate", str(spec))
    assert result.exit_code == 2 and "Traceback" not in result.output
    said = " ".join(result.output.split())
    assert str(spec) in said and "prune.select.shipped: every arm's GGUF file" in said
    assert "qwen2 MLP has no bias" in said and f"GGUF metadata of {tmp_path / 'q.gguf'}" in said
    assert "lstsq = { intercept = false }" in said and "select.shipped = false" in said
    result = run("validate", str(spec), "--set", "prune.select.shipped=false")
    assert result.exit_code == 0, result.output
    assert warnings_of(result.output)[0].startswith("prune.select: if the recommended arm is refit")
