"""The names users and plugin authors import keep working whatever the package layout."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import geospec
from geospec.cli import cli


def test_top_level_names() -> None:
    from geospec.measure import measure_profiles, measure_work
    from geospec.registry.hookspecs import hookimpl

    assert geospec.__version__ == "0.2.0"
    assert geospec.hookimpl is hookimpl
    assert geospec.measure_work is measure_work
    assert geospec.measure_profiles is measure_profiles


def test_plugin_author_api() -> None:
    import geospec.kinds as kinds
    from geospec.plugin import Plugin, PluginParams, Register, SmootherRef, SolverRef
    from geospec.testing import minimal_spec, registered

    for name in kinds.__all__:
        assert hasattr(kinds, name), name
    assert set(kinds.KINDS) == {
        "geometry", "statistic", "smoother", "solver", "schedule", "launcher", "tracker",
        "importance",
    }  # fmt: skip
    assert all(issubclass(base, Plugin) for base in kinds.KINDS.values())
    assert PluginParams.model_config["extra"] == "forbid"
    assert callable(minimal_spec) and callable(registered)
    assert Register is not None and SmootherRef is not None and SolverRef is not None


def runs_without_torch_or_numpy(code: str) -> None:
    """``code`` succeeds in a fresh interpreter, which then holds neither torch nor numpy."""
    check = "import sys\nassert not {'torch', 'numpy'} & set(sys.modules), 'heavy import'\n"
    result = subprocess.run([sys.executable, "-c", code + check], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_the_contract_kit_imports_from_geospec_testing_without_torch() -> None:
    """docs/plugins.md's names; a torch-free plugin package imports them (and no torch)."""
    code = (
        "from geospec.testing import (ContractError, check_geometry, check_importance,\n"
        "    check_launcher, check_schedule, check_smoother, check_solver, check_statistic,\n"
        "    check_tracker, minimal_spec, registered)\n"
        "assert issubclass(ContractError, AssertionError)\n"
    )
    runs_without_torch_or_numpy(code)


def test_spec_package_exports_load_and_validate() -> None:
    from geospec.spec import Spec, load_spec, validate_spec
    from geospec.testing import minimal_spec

    assert isinstance(validate_spec(minimal_spec()), Spec)
    assert callable(load_spec)


def test_python_dash_m_geospec() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "geospec", "--version"], capture_output=True, text=True
    )
    assert result.returncode == 0 and geospec.__version__ in result.stdout, result.stderr
    listed = subprocess.run(
        [sys.executable, "-m", "geospec", "--help"], capture_output=True, text=True
    )
    for command in (
        "validate",
        "plugins",
        "schema",
        "widths",
        "run",
        "train",
        "diagnose",
        "demand",
        "report",
    ):
        assert command in listed.stdout, command


#: Names an earlier README or docs page showed users importing, at their old homes (0.1.0), and
#: where they live now. Each keeps importing, with a DeprecationWarning naming the new home.
MOVED = [
    ("geospec.specfile", "validate_spec", "geospec.spec"),
    ("geospec.specfile", "load_spec", "geospec.spec"),
    ("geospec.widths", "compute_widths", "geospec.solve.widths"),
    ("geospec.widths", "write_widths", "geospec.solve.widths"),
    ("geospec.widths", "read_profiles", "geospec.profiles"),
    ("geospec.train", "train_model", "geospec.engine.train"),
    ("geospec.train", "load_model", "geospec.engine.train"),
    ("geospec.model", "GPT", "geospec.engine.model"),
    ("geospec.model", "GPTConfig", "geospec.engine.model"),
    ("geospec.model", "config_from_spec", "geospec.engine.model"),
    ("geospec.intrinsic_dimension", "two_nn", "geospec.measure.intrinsic_dimension"),
    ("geospec.intrinsic_dimension", "fit_two_nn", "geospec.measure.intrinsic_dimension"),
    ("geospec.data", "prepare_data", "geospec.engine.token_data"),
    # 0.2.0's homes, moved down a floor (docs/architecture.md, "Packages in layers")
    ("geospec.solve.profiles", "read_profiles", "geospec.profiles"),
    ("geospec.solve.profiles", "check_profile", "geospec.profiles"),
    ("geospec.engine.model_size", "count_params", "geospec.shapes.model_size"),
    # 0.2.0's prune/apply.py, split by step (README shows export_pruned and its padded export)
    ("geospec.prune.apply", "export_pruned", "geospec.prune.hf_export"),
    ("geospec.prune.apply", "pruned", "geospec.prune.cut"),
    ("geospec.prune.apply", "calibration_stats", "geospec.measure.calibration"),
    *(
        ("geospec.sensitivity", name, "geospec.measure.sensitivity")
        for name in (
            "loss_batches",
            "layer_sensitivity",
            "additivity",
            "sample_pairs",
            "mean_loss",
            "scaled_sublayers",
            "next_token_loss",
        )
    ),
]


@pytest.mark.parametrize(("old", "name", "new"), MOVED)
def test_moved_names_still_import_with_a_warning_naming_the_new_home(
    old: str, name: str, new: str
) -> None:
    with pytest.warns(DeprecationWarning, match=rf"{old}\.{name} moved to {new}\.{name}"):
        value = getattr(importlib.import_module(old), name)
    assert value is getattr(importlib.import_module(new), name)


def test_old_plugin_package_test_still_runs() -> None:
    # What the first release's README told plugin authors to write in their tests.
    code = (
        "from geospec.specfile import validate_spec\n"
        "from geospec.testing import minimal_spec\n"
        "print(type(validate_spec(minimal_spec())).__name__)"
    )
    result = subprocess.run(
        [sys.executable, "-W", "error::DeprecationWarning:__main__", "-c", code],
        capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 1 and "geospec.spec.validate_spec" in result.stderr
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.strip() == "Spec", result.stderr


def test_every_old_home_imports_without_torch_and_names_only_what_its_new_home_holds() -> None:
    """The old modules are built by geospec.moved (no file each): importing one is as light as
    the file was, and every name it lists exists where it says."""
    from geospec.moved import OLD_MODULES

    code = (
        "import importlib\n"
        "from geospec.moved import OLD_MODULES\n"
        "for old in OLD_MODULES:\n"
        "    assert importlib.import_module(old).__name__ == old, old\n"
    )
    runs_without_torch_or_numpy(code)
    for old, homes in OLD_MODULES.items():
        for name, new in homes.items():
            assert hasattr(importlib.import_module(new), name), f"{old}.{name} -> {new}"


def test_moved_module_reports_an_unknown_name_plainly() -> None:
    import geospec.train

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(AttributeError, match=r"geospec\.train.*no attribute 'nope'"):
            geospec.train.nope  # noqa: B018


def test_a_mistyped_command_gets_a_suggestion() -> None:
    result = CliRunner().invoke(cli, ["stauts"])
    assert result.exit_code == 2 and "Did you mean 'status'?" in result.output
    result = CliRunner().invoke(cli, ["xyzzy"])
    assert result.exit_code == 2 and "Did you mean" not in result.output


def test_shipped_specs_run_by_name_from_any_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["validate", "tiny"])
    assert result.exit_code == 0 and "is valid" in result.output, result.output
    checkout = Path(__file__).parents[1] / "specs"
    from geospec.spec.loading import shipped_specs

    assert set(shipped_specs()) == {path.stem for path in checkout.glob("*.toml")}
    # A file of that name in the current directory wins over the shipped one.
    (tmp_path / "tiny").write_text("not toml [")
    result = CliRunner().invoke(cli, ["validate", "tiny"])
    assert result.exit_code == 2 and "tiny" in result.output
    result = CliRunner().invoke(cli, ["validate", "no-such-spec"])
    assert result.exit_code == 2 and "name a shipped spec (121m," in result.output


@pytest.mark.slow
def test_wheel_ships_specs_data_and_shims(tmp_path: Path) -> None:
    root = Path(__file__).parents[1]
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path), str(root)],
        check=True,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("geospec-*.whl")
    assert wheel.name.startswith(f"geospec-{geospec.__version__}-")  # pyproject agrees
    names = set(zipfile.ZipFile(wheel).namelist())
    for shipped in root.glob("specs/*.toml"):
        assert f"geospec/specs/{shipped.name}" in names
    assert {
        "geospec/data/__init__.py",
        "geospec/data/austen.txt.gz",
        "geospec/data/python-code.txt.gz",  # the mix's parts, with their licence and notice
        "geospec/data/python-docs.txt.gz",
        "geospec/data/LICENSE-PSF.txt",
        "geospec/data/corpora.md",
        "geospec/moved.py",  # the shims of geospec.specfile and the other old homes
    } <= names
    # every subpackage of the checkout is in the wheel (pyproject lists them by hand), the
    # builtin plugins' (plugins/ ships as geospec_plugins) too
    for init in (root / "geospec").rglob("__init__.py"):
        assert init.relative_to(root).as_posix() in names, init
    for init in (root / "plugins").rglob("__init__.py"):
        assert f"geospec_plugins/{init.relative_to(root / 'plugins').as_posix()}" in names, init


def test_every_command_taking_a_spec_accepts_a_shipped_name() -> None:
    from geospec.cli import COMMANDS, cli
    from geospec.cli.console import SpecFile

    ctx = click.Context(cli)
    taking = []
    for name in COMMANDS:
        command = cli.get_command(ctx, name)
        assert command is not None
        for param in command.params:
            if param.name == "spec_path":
                taking.append(name)
                assert isinstance(param.type, SpecFile), name
    assert {"run", "validate", "widths", "prepare", "rehearse"} <= set(taking)
