"""Plugins from Python files (a spec's ``plugins``, ``--plugin``): registered like an entry
point's, recorded in plugins.json with the file's sha256, refused in one line when missing or
hookless; the measure key holds every measuring plugin's provenance, so an edited plugin
re-measures its own profiles and nothing else; ``measure = "all"`` is pinned when a run begins.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tomlkit
from click.testing import CliRunner, Result

from geospec.cli import cli
from geospec.pipeline.run_dir import pin_measures
from geospec.pipeline.status import status
from geospec.registry.files import PLUGIN_FILES_ENV
from geospec.registry.loading import reset_default_registries
from geospec.rundir.layout import MEASURES_FILE
from geospec.spec.loading import validate_spec
from geospec.testing import minimal_spec

#: A geometry in a file: the L1 distance times SCALE (a test edits SCALE).
GEOMETRY = """
from typing import Literal

from geospec import hookimpl
from geospec.kinds import Geometry
from geospec.plugin import PluginParams

SCALE = 1.0


class Manhattan(Geometry):
    class Params(PluginParams):
        kind: Literal["manhattan"] = "manhattan"

    scale_sensitive = True

    def prepare(self, cloud):
        return cloud.double()

    def pairwise(self, points):
        import torch

        return SCALE * torch.cdist(points, points, p=1)

    def paired(self, a, b):
        return SCALE * (a - b).abs().sum(dim=1)


@hookimpl
def geospec_register_geometries(register):
    register(Manhattan)
"""


@pytest.fixture(autouse=True)
def isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """Each test starts without plugin files, and leaves none (nor their modules) behind: as a
    new process would."""
    monkeypatch.setenv(PLUGIN_FILES_ENV, "")
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield
    for name, module in list(sys.modules.items()):
        if str(getattr(module, "__file__", "") or "").startswith(str(tmp_path)):
            del sys.modules[name]
    monkeypatch.setenv(PLUGIN_FILES_ENV, "")
    reset_default_registries()


def write_spec(directory: Path, **keys: Any) -> Path:
    spec = minimal_spec(measure=[{"geometry": "manhattan", "statistic": "shift"}], **keys)
    path = directory / "spec.toml"
    path.write_text(tomlkit.dumps(spec))
    return path


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def test_a_spec_names_a_plugin_file_relative_to_itself(tmp_path: Path) -> None:
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "manhattan_geometry.py").write_text(GEOMETRY)
    spec = write_spec(tmp_path, plugins=["plugins/manhattan_geometry.py"])
    result = invoke("validate", str(spec))
    assert result.exit_code == 0, result.output
    assert "shift/manhattan" in result.output


def test_without_the_file_its_plugin_is_unknown(tmp_path: Path) -> None:
    result = invoke("validate", str(write_spec(tmp_path)))
    assert result.exit_code == 2 and "unknown geometry 'manhattan'" in result.output


def test_plugin_option_registers_the_file_and_plugins_json_records_its_sha256(
    tmp_path: Path,
) -> None:
    path = tmp_path / "manhattan_option.py"
    path.write_text(GEOMETRY)
    result = invoke("plugins", "--json", "--plugin", str(path))
    assert result.exit_code == 0, result.output
    [entry] = [p for p in json.loads(result.output)["plugins"] if p.get("path")]
    assert entry["path"] == str(path.resolve())
    assert entry["sha256"] == "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
    assert entry["kinds"]["geometry"] == ["manhattan"] and entry["from_source"] is True
    assert invoke("validate", str(write_spec(tmp_path)), "--plugin", str(path)).exit_code == 0


@pytest.mark.parametrize(
    ("name", "text", "said"),
    [
        ("absent.py", None, "plugin file {path} does not exist"),
        ("hookless_module.py", "X = 1\n", "plugin file {path} has no @geospec.hookimpl hook"),
        ("notes.txt", GEOMETRY, "plugin file {path} is not a Python file (.py)"),
        ("broken_import.py", "import no_such_module\n", "plugin file {path} fails to import"),
        ("json.py", GEOMETRY, "would hide the module"),
    ],
)
def test_a_file_that_cannot_be_a_plugin_is_refused_in_one_line(
    tmp_path: Path, name: str, text: str | None, said: str
) -> None:
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    for args, where in (
        (["plugins", "--plugin", str(path)], "--plugin"),
        (["validate", str(write_spec(tmp_path, plugins=[name]))], "spec.toml: plugins"),
    ):
        result = invoke(*args)
        assert result.exit_code == 2, result.output
        message = result.output.strip()
        assert message.startswith("error: ") and where in message, message
        assert said.format(path=path if args[0] == "plugins" else tmp_path / name) in message
        assert "Traceback" not in message and len(message.splitlines()) == 1


# -- provenance: the measure key ---------------------------------------------------------------


def run_until_measure(spec: Path) -> str:
    reset_default_registries()  # as a new process: the plugin files are read afresh
    for name in [n for n, m in sys.modules.items() if n.startswith("manhattan")]:
        del sys.modules[name]
    result = invoke("run", str(spec), "--until", "measure")
    assert result.exit_code == 0, result.output + repr(result.exception)
    return result.output


@pytest.mark.torch
def test_an_edited_plugin_file_re_measures_its_profiles_and_nothing_else(tmp_path: Path) -> None:
    from small_spec import small_spec

    plugin = tmp_path / "manhattan_edited.py"
    plugin.write_text(GEOMETRY)
    text = small_spec(
        "edited", {"steps": 2}, arms=("uniform",), out=str(tmp_path / "run"),
        plugins=[plugin.name], probe={"tokens": 64},
    ).replace(
        "measure = []",
        'measure = [{geometry = "manhattan", statistic = "shift"}, '
        '{geometry = "raw", statistic = "shift"}]',
    )  # fmt: skip
    spec = tmp_path / "spec.toml"
    spec.write_text(text)
    assert "measure: 2 profiles" in run_until_measure(spec)
    first = json.loads((tmp_path / "run" / "profiles.json").read_text())
    assert first["plugins"]["shift/manhattan"]["geometry"] == {
        "distribution": plugin.name,
        "version": None,
        "source": "sha256:" + hashlib.sha256(plugin.read_bytes()).hexdigest(),
    }
    assert "up to date" in run_until_measure(spec).splitlines()[-1]  # unchanged: nothing to do

    plugin.write_text(GEOMETRY.replace("SCALE = 1.0", "SCALE = 2.0"))
    output = run_until_measure(spec)
    assert "measure: 1 profiles" in output
    second = json.loads((tmp_path / "run" / "profiles.json").read_text())
    # the shift is the mean paired distance: twice the distance, twice the work
    assert second["profiles"]["shift/manhattan"] == pytest.approx(
        [2 * v for v in first["profiles"]["shift/manhattan"]], rel=1e-12
    )
    assert second["profiles"]["shift/raw"] == first["profiles"]["shift/raw"]
    assert second["keys"]["shift/raw"] == first["keys"]["shift/raw"]
    assert second["keys"]["shift/manhattan"] != first["keys"]["shift/manhattan"]


# -- measure = "all", pinned when a run begins ------------------------------------------------


def test_measure_all_is_pinned_at_the_first_run_and_a_later_install_is_said(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.json").write_text(json.dumps({"name": "t", "arms": [], "seeds": []}))
    spec = validate_spec(minimal_spec(measure="all"))
    said: list[str] = []
    first = pin_measures(spec, run_dir, said.append)
    builtin = [e.profile for e in first.measure or []]
    assert len(builtin) == 9 and said == [] and status(run_dir)["notes"] == []

    plugin = tmp_path / "manhattan_later.py"
    plugin.write_text(GEOMETRY)
    invoke("plugins", "--plugin", str(plugin))  # installed later: "all" would mean more now
    again = pin_measures(spec, run_dir, said.append)
    assert [e.profile for e in again.measure or []] == builtin  # the run's keys stay
    added = "shift/manhattan, gw/manhattan, topology/manhattan"
    [line] = said
    assert f"the plugins installed now adds {added}: this run keeps its profiles" in line
    [note] = status(run_dir)["notes"]
    assert added in note and MEASURES_FILE in note

    explicit = validate_spec(minimal_spec(measure=[{"geometry": "raw", "statistic": "shift"}]))
    assert pin_measures(explicit, run_dir, said.append) == explicit
    assert not (run_dir / MEASURES_FILE).exists()  # a spec that lists its measures keeps none


# -- the commands that read a spec say why a plugin is missing, and take --plugin ------------

#: A schedule in a file: every layer at the uniform width (a test's plugin; `flat`).
SCHEDULE = """
from typing import Literal

from geospec import hookimpl
from geospec.kinds import Schedule
from geospec.plugin import PluginParams


class Flat(Schedule):
    class Params(PluginParams):
        kind: Literal["flat"] = "flat"

    def widths(self, dims, profiles):
        return [dims.ffn_width] * dims.n_layers


@hookimpl
def geospec_register_schedules(register):
    register(Flat)
"""


def flat_spec(directory: Path) -> Path:
    spec = minimal_spec(
        measure=[],
        arms=[
            {"name": "uniform", "schedule": {"kind": "uniform"}},
            {"name": "flat", "schedule": {"kind": "flat"}},
        ],
    )
    path = directory / "spec.toml"
    path.write_text(tomlkit.dumps(spec))
    return path


def test_widths_names_the_plugin_that_failed_to_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file is in effect as geospec's processes pass it on (the environment); it fails to
    import, so 'flat' is unknown: the import error is said, not only "did you mean 'flap'"."""
    broken = tmp_path / "flat_broken.py"
    broken.write_text("import no_such_module_for_flat\n" + SCHEDULE)
    monkeypatch.setenv(PLUGIN_FILES_ENV, str(broken))
    reset_default_registries()
    result = invoke("widths", str(flat_spec(tmp_path)))
    assert result.exit_code == 2
    assert "plugin flat_broken.py failed to load: ModuleNotFoundError" in result.output
    assert "unknown schedule 'flat'" in result.output


@pytest.mark.torch
def test_rehearse_takes_plugin_files(tmp_path: Path) -> None:
    path = tmp_path / "flat_schedule.py"
    path.write_text(SCHEDULE)
    spec = flat_spec(tmp_path)
    result = invoke("rehearse", str(spec), "--steps", "1", "--context", "8", "--json")
    assert result.exit_code == 2 and "unknown schedule 'flat'" in result.output
    result = invoke(
        "rehearse", str(spec), "--plugin", str(path), "--steps", "1", "--context", "8", "--json"
    )
    assert result.exit_code == 0, result.output
    assert {row["arm"] for row in json.loads(result.output)["arms"]} == {"uniform", "flat"}


def test_debug_after_the_command_shows_the_traceback(tmp_path: Path) -> None:
    spec = minimal_spec()
    spec["model"]["n_heads"] = 5  # does not divide d_model
    path = tmp_path / "spec.toml"
    path.write_text(tomlkit.dumps(spec))
    for args in (["--debug", "validate", str(path)], ["validate", str(path), "--debug"]):
        result = invoke(*args)
        assert result.exit_code != 0 and result.exception is not None, args  # re-raised
    result = invoke("validate", str(path))
    assert result.exit_code == 2 and "model.n_heads" in result.output
