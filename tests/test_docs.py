"""The README and docs say what geospec does: their examples are checked against its real output,
and the files they name exist."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from geospec.cli import cli
from geospec.registry.files import PLUGIN_FILES_ENV
from geospec.registry.loading import reset_default_registries

ROOT = Path(__file__).parents[1]
README = (ROOT / "README.md").read_text()
MARKDOWN = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "examples").glob("*/README.md")),
]


def block_after(text: str, marker: str, language: str = "") -> str:
    """The first fenced block (of ``language``) after ``marker`` in ``text``."""
    after = text.split(marker, 1)[1]
    return after.split(f"```{language}\n", 1)[1].split("```", 1)[0]


def test_the_readme_error_example_is_the_real_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """README's spec, saved as specs/x.toml with d_model misspelt and the cosine arm's start
    -1, gives exactly the lines README shows (a line ending in '...)' abbreviates the real one)."""
    spec = block_after(README, "## The spec", "toml")
    assert "d_model = 128" in spec and "start = 1.5" in spec
    (tmp_path / "specs").mkdir()
    broken = spec.replace("d_model = 128", "d_modle = 128").replace("start = 1.5", "start = -1")
    (tmp_path / "specs" / "x.toml").write_text(broken)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["validate", "specs/x.toml"])
    assert result.exit_code == 2
    shown = block_after(README, "Invalid specs are reported").strip().splitlines()
    real = result.output.strip().splitlines()
    assert len(shown) == len(real), result.output
    for said, printed in zip(shown, real, strict=True):
        if said.endswith("...)"):
            assert printed.startswith(said.removesuffix("...)")), (said, printed)
        else:
            assert said == printed


def test_the_readme_plugins_json_example_has_the_real_shape(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every key README shows is in the real output and the other way round: the geospec entry,
    its kinds, its version, and a plugin that failed to load (a plugin file that fails to
    import, named in the environment as geospec's processes pass them on)."""
    import geospec

    shown = json.loads(
        block_after(README, "`geospec plugins --json` prints", "json").replace("[...]", "[]")
    )
    broken = tmp_path / "broken_plugin_file.py"
    broken.write_text("import no_such_module_here\n")
    monkeypatch.setenv(PLUGIN_FILES_ENV, str(broken))
    monkeypatch.setattr(sys, "path", list(sys.path))
    reset_default_registries()
    try:
        result = CliRunner().invoke(cli, ["plugins", "--json"])
    finally:
        monkeypatch.setenv(PLUGIN_FILES_ENV, "")
        reset_default_registries()
    assert result.exit_code == 0, result.output
    real = json.loads(result.output)
    assert set(shown) == set(real)
    [ours] = [p for p in real["plugins"] if p["name"] == "geospec"]
    assert set(shown["plugins"][0]) == set(ours)
    assert shown["plugins"][0]["version"] == geospec.__version__ == ours["version"]
    assert list(shown["plugins"][0]["kinds"]) == list(ours["kinds"])
    assert set(shown["errors"][0]) == set(real["errors"][0])
    assert "ModuleNotFoundError: " in real["errors"][0]["error"]


#: A markdown link's target: [text](target), not a web address or an anchor of the same page.
LINK = re.compile(r"\]\(([^)\s#]+)(#[^)\s]*)?\)")


@pytest.mark.parametrize("page", MARKDOWN, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_file_a_page_links_to_exists(page: Path) -> None:
    text = page.read_text()
    missing = [
        target
        for target, _ in LINK.findall(text)
        if "://" not in target
        and not target.startswith("mailto:")
        and not (page.parent / target).exists()
    ]
    assert not missing, f"{page.relative_to(ROOT)} links to {missing}"
    # a file named in prose without a link (PAPER.md was one that never existed)
    for named in re.findall(r"\b[A-Z][A-Z_]+\.md\b", text):
        assert (ROOT / named).exists() or (page.parent / named).exists(), named


def test_the_step_example_readme_names_its_spec() -> None:
    readme = (ROOT / "examples" / "geospec-step" / "README.md").read_text()
    named = re.search(r"geospec widths (\S+\.toml)", readme)
    assert named is not None and (ROOT / named.group(1)).is_file()


def test_the_step_example_spec_gives_the_widths_its_readme_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Six layers of 384 in multiples of 16, the first three twice as wide: n = 2304 / (3 x 2 +
    3) = 256 for the last three, 512 for the first (a budget of 3 x 512 + 3 x 256 = 2304)."""
    import importlib.util

    from geospec.testing import registered

    source = ROOT / "examples" / "geospec-step" / "src" / "geospec_step" / "__init__.py"
    found = importlib.util.spec_from_file_location("geospec_step", source)
    assert found is not None and found.loader is not None
    module = importlib.util.module_from_spec(found)
    monkeypatch.setitem(sys.modules, "geospec_step", module)
    found.loader.exec_module(module)
    spec = ROOT / "examples" / "geospec-step" / "spec.toml"
    with registered(module, name="geospec-step"):
        result = CliRunner().invoke(cli, ["widths", str(spec), "--json"])
    assert result.exit_code == 0, result.output
    widths = json.loads(result.output)["arms"]["step"]["widths"]
    assert widths == [512, 512, 512, 256, 256, 256]


def quick_start_beside_a_checkpoint(
    directory: Path, monkeypatch: pytest.MonkeyPatch, spec: str
) -> None:
    """``spec`` as specs/prune-quickstart.toml in ``directory`` (the working directory), beside
    its my-model/: a Llama config of 8 layers and 2048 positions (no weights: validate reads
    the shape)."""
    (directory / "specs" / "my-model").mkdir(parents=True)
    (directory / "specs" / "prune-quickstart.toml").write_text(spec)
    config = {
        "model_type": "llama", "num_hidden_layers": 8, "hidden_size": 64,
        "num_attention_heads": 4, "intermediate_size": 256, "vocab_size": 100,
        "max_position_embeddings": 2048,
    }  # fmt: skip
    (directory / "specs" / "my-model" / "config.json").write_text(json.dumps(config))
    monkeypatch.chdir(directory)
    monkeypatch.setenv("GEOSPEC_SKIP_MEMORY_CHECK", "1")


def test_the_prune_guide_error_example_is_the_real_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/prune.md's example: the quick start beside a checkpoint of 2048 positions, with an
    eval corpus that is not there and model.seq_len 4096."""
    guide = (ROOT / "docs" / "prune.md").read_text()
    shown = block_after(guide, "skips that check):").strip()
    quick_start_beside_a_checkpoint(
        tmp_path, monkeypatch, (ROOT / "specs" / "prune-quickstart.toml").read_text()
    )
    result = CliRunner().invoke(
        cli,
        [
            "validate", "specs/prune-quickstart.toml", "--set", "model.seq_len=4096",
            "--set", 'prune.eval.corpora=["held-out.txt"]',
        ],
    )  # fmt: skip
    assert result.exit_code == 2
    assert result.output.strip() == shown


def test_the_prune_guides_search_example_validates_pasted_into_the_quick_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/prune.md's evolve example, pasted into the quick start spec in place of its arms
    list as the guide says, is a spec validate accepts with the searched arm added (the
    example once used [[prune.arms]] tables, which collide with the quick start's inline list:
    "'arms' is defined twice")."""
    guide = (ROOT / "docs" / "prune.md").read_text()
    shown = block_after(guide, "### The evolutionary search", "toml")
    quick = (ROOT / "specs" / "prune-quickstart.toml").read_text()
    listed = re.search(r"^arms = \[\n.*?^\]\n", quick, re.S | re.M)
    assert listed is not None
    quick_start_beside_a_checkpoint(tmp_path, monkeypatch, quick.replace(listed.group(0), shown))
    result = CliRunner().invoke(cli, ["validate", "specs/prune-quickstart.toml"])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(cli, ["validate", "specs/prune-quickstart.toml", "--json"])
    arms = {arm["name"]: arm["schedule"] for arm in json.loads(result.output)["prune"]["arms"]}
    assert list(arms) == ["uniform", "protect-ends", "shift-spherical", "searched"]
    assert arms["searched"]["kind"] == "evolve"
    assert arms["searched"]["start_arm"] == "shift-spherical"
