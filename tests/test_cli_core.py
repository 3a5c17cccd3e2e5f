"""The torch-free CLI: validate, plugins, schema."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import tomlkit
from click.testing import CliRunner
from test_validate_files import gguf_extra_missing

from geospec import __version__
from geospec.cli import cli
from geospec.registry.loading import get_registries
from geospec.testing import minimal_spec

ROOT = Path(__file__).parents[1]


def test_version_and_help() -> None:
    runner = CliRunner()
    assert __version__ in runner.invoke(cli, ["--version"]).output
    result = runner.invoke(cli, ["--help"])
    assert result.exit_code == 0
    for command in ("validate", "plugins", "schema"):
        assert command in result.output


def test_validate_prints_budget(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text(tomlkit.dumps(minimal_spec()))
    result = CliRunner().invoke(cli, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    assert "4 x 64 = 256" in result.output  # n_layers x uniform width: the budget


def test_validate_counts_grouped_query_attention(tmp_path: Path) -> None:
    """SmolLM2-135M's published shape (9 query heads sharing 3 key/value heads, tied embeddings)
    has 134,515,008 parameters; without n_kv_heads geospec would count 147.8M."""
    smollm2 = {
        "n_layers": 30,
        "d_model": 576,
        "n_heads": 9,
        "n_kv_heads": 3,
        "ffn_width": 1536,
        "seq_len": 2048,
        "vocab_size": 49152,
        "multiple_of": 64,
        "activation": "swiglu",
        "norm": "rmsnorm",
        "positions": "rope",
        "bias": False,
    }
    path = tmp_path / "s.toml"
    path.write_text(tomlkit.dumps(minimal_spec(model=smollm2)))
    result = CliRunner().invoke(cli, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    assert "134,515,008" in result.output
    assert "9 heads (3 key/value)" in result.output


def test_plugins_table_lists_builtins() -> None:
    result = CliRunner().invoke(cli, ["plugins"])
    assert result.exit_code == 0
    assert "cosine" in result.output and "geospec" in result.output


def test_schema_describes_plugin_params_and_accepts_specs() -> None:
    result = CliRunner().invoke(cli, ["schema"])
    assert result.exit_code == 0
    schema = json.loads(result.output)
    text = json.dumps(schema)
    assert '"cosine"' in text and "Width of the first layer" in text
    jsonschema.validate(minimal_spec(), schema)
    bad = minimal_spec(arms=[{"name": "uniform", "schedule": {"kind": "cosine", "start": -1}}])
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


@pytest.mark.parametrize("spec", sorted((ROOT / "specs").glob("*.toml")), ids=lambda p: p.name)
def test_shipped_specs_validate(spec: Path) -> None:
    result = CliRunner().invoke(cli, ["validate", str(spec)])
    data = tomlkit.parse(spec.read_text()).unwrap()
    checkpoint = data.get("reference", {}).get("checkpoint")
    if checkpoint and not Path(checkpoint).expanduser().exists():
        # A template for the user's own copy of a checkpoint (or the GGUF `nox -s gguf`
        # fetches): the placeholder path is named, not accepted
        assert result.exit_code == 2, result.output
        assert "reference.checkpoint:" in result.output and "does not exist" in result.output
    elif str(checkpoint).endswith(".gguf") and gguf_extra_missing():
        # the core session has no gguf extra: validate says so before any prune tries
        assert result.exit_code == 2, result.output
        assert 'pip install "geospec[gguf]"' in result.output
    else:
        assert result.exit_code == 0, result.output


def test_validate_does_not_import_torch(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text(tomlkit.dumps(minimal_spec()))
    code = (
        "import sys; from geospec.cli import main\n"
        "sys.argv = ['geospec', 'validate', sys.argv[1]]\n"
        "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "assert 'numpy' not in sys.modules, 'numpy was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code, str(path)], check=True)


def test_python_dash_m_entry() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "geospec", "--version"], capture_output=True, text=True, check=True
    )
    assert __version__ in result.stdout


def test_readme_starts_with_the_two_commands_and_ci_runs_the_second() -> None:
    readme = (ROOT / "README.md").read_text()
    blocks = [b.split("```", 1)[0].strip() for b in readme.split("```bash\n")[1:3]]
    run_command, test_command = blocks
    assert run_command.endswith("geospec run specs/tiny.toml")
    assert (ROOT / "specs" / "tiny.toml").exists()
    assert test_command in (ROOT / ".ci" / "run").read_text()


def test_the_test_extra_carries_the_gguf_extra_the_default_run_needs() -> None:
    """The default test run reads and writes GGUF checkpoints, which needs the gguf extra whole
    (validate refuses a GGUF reference without accelerate): a fresh install of the test extra
    alone must bring it, as the README's test command installs nothing else."""
    extras = tomlkit.parse((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert set(extras["gguf"]) <= set(extras["test"]), set(extras["gguf"]) - set(extras["test"])


def test_ci_runs_the_readmes_commands_in_a_fresh_environment() -> None:
    """CI installs the README's commands into a virtual environment of its own, so that a
    dependency missing from pyproject.toml fails CI as it fails a user's fresh install."""
    ci = (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    run_command, test_command = [
        b.split("```", 1)[0].strip() for b in readme.split("```bash\n")[1:3]
    ]
    fresh = ci.index("-m venv")
    assert fresh < ci.index(run_command) and fresh < ci.index(test_command)


def test_validate_summary_shows_the_training_settings_and_the_launcher(tmp_path: Path) -> None:
    spec = minimal_spec(launch={"kind": "pool", "workers": 2})
    spec["train"].update(lr=1.5e-3, precision="fp32", device="cpu")
    path = tmp_path / "s.toml"
    path.write_text(tomlkit.dumps(spec))
    result = CliRunner().invoke(cli, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "lr 0.0015" in said and "precision fp32, device cpu" in said
    assert "launch pool(workers=2, gpus=False)" in said


def test_the_prune_quick_start_spec_is_short_and_validates_without_torch(tmp_path: Path) -> None:
    """specs/prune-quickstart.toml (README, docs/prune.md) beside a save_pretrained directory's
    config.json: valid, torch-free, and at most 15 lines of TOML."""
    shipped = ROOT / "specs" / "prune-quickstart.toml"
    text = shipped.read_text()
    lines = [line for line in text.splitlines() if line.split("#")[0].strip()]
    assert len(lines) <= 15, lines
    spec = tmp_path / "prune-quickstart.toml"
    spec.write_text(text)
    checkpoint = tmp_path / tomlkit.parse(text).unwrap()["reference"]["checkpoint"]
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(
        json.dumps(
            {"model_type": "llama", "num_hidden_layers": 8, "hidden_size": 256,
             "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 512,
             "vocab_size": 1000, "max_position_embeddings": 2048}
        )
    )  # fmt: skip
    code = (
        "import sys; from geospec.cli import main\n"
        "sys.argv = ['geospec', 'validate', sys.argv[1]]\n"
        "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(spec)], capture_output=True, text=True, check=True
    )
    assert "is valid" in done.stdout and "8 x 512 = 4096" in done.stdout
    assert "the checkpoint is pruned" in done.stdout
    # measure = "all" (the default) is what its arms read: shift/spherical, which is probed;
    # no other registered profile is named
    said = " ".join(done.stdout.split())
    registered = {f"{s}/{g}" for s, g in get_registries().all_measures()}
    assert "measures shift/spherical (what the [prune] arms read:" in said
    assert [name for name in registered if name in said] == ["shift/spherical"]
    assert "probe skipped" not in said
    # without the geometric arm nothing reads a profile: nothing is measured or probed
    data = tomlkit.parse(text)
    data["prune"]["arms"] = [a for a in data["prune"]["arms"] if a["name"] != "shift-spherical"]
    spec.write_text(tomlkit.dumps(data))
    found = CliRunner().invoke(cli, ["validate", str(spec)])
    assert found.exit_code == 0, found.output
    said = " ".join(found.output.split())
    assert "measures none (the [prune] arms read no measured profile;" in said
    assert "probe skipped: nothing reads the clouds" in said
    assert not any(name in said for name in registered)
    spec.write_text(text)
    widths = CliRunner().invoke(cli, ["widths", str(spec)])  # no [[arms]]: no empty table
    assert widths.exit_code == 0 and "has no [[arms]]: it prunes the checkpoint" in widths.output
    readme = (ROOT / "README.md").read_text()
    guide = (ROOT / "docs" / "prune.md").read_text()
    assert text.strip() in guide  # the guide shows the file as it is
    assert "specs/prune-quickstart.toml" in readme
    assert f"({len(lines)} lines:" in " ".join(readme.split())  # the README counts them right


@pytest.mark.parametrize("spec", sorted((ROOT / "specs").glob("*.toml")), ids=lambda p: p.name)
def test_the_schema_accepts_every_shipped_spec(spec: Path) -> None:
    """`geospec schema` describes what the spec format accepts: a spec of a pretrained
    checkpoint leaves out [model]'s shape, and a prune of one [[arms]] and [train]."""
    schema = json.loads(CliRunner().invoke(cli, ["schema"]).output)
    jsonschema.validate(tomlkit.parse(spec.read_text()).unwrap(), schema)


def test_the_schema_requires_what_a_trained_spec_needs() -> None:
    schema = json.loads(CliRunner().invoke(cli, ["schema"]).output)
    spec = minimal_spec()
    for missing in ("arms", "train"):
        with pytest.raises(jsonschema.ValidationError, match=f"'{missing}' is a required"):
            jsonschema.validate({k: v for k, v in spec.items() if k != missing}, schema)
    shapeless = spec | {"model": {"seq_len": 64}}
    with pytest.raises(jsonschema.ValidationError, match="'n_layers' is a required"):
        jsonschema.validate(shapeless, schema)
    arms = [{"name": "uniform", "schedule": {"kind": "uniform"}}]
    pretrained = shapeless | {"reference": {"checkpoint": "model"}, "prune": {"arms": arms}}
    del pretrained["arms"], pretrained["train"]
    jsonschema.validate(pretrained, schema)
