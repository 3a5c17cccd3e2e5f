"""The names users and plugin authors import keep working whatever the package layout."""

from __future__ import annotations

import subprocess
import sys

import geospec


def test_top_level_names() -> None:
    from geospec.measure import measure_profiles, measure_work
    from geospec.registry.hookspecs import hookimpl

    assert geospec.__version__ == "0.1.0"
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


def test_the_contract_kit_imports_from_geospec_testing_without_torch() -> None:
    """docs/plugins.md's names; a torch-free plugin package imports them (and no torch)."""
    code = (
        "import sys\n"
        "from geospec.testing import (ContractError, check_geometry, check_importance,\n"
        "    check_launcher, check_schedule, check_smoother, check_solver, check_statistic,\n"
        "    check_tracker, minimal_spec, registered)\n"
        "assert issubclass(ContractError, AssertionError)\n"
        "assert 'torch' not in sys.modules and 'numpy' not in sys.modules, 'heavy import'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_spec_package_exports_load_and_validate() -> None:
    from geospec.spec import Spec, load_spec, validate_spec
    from geospec.testing import minimal_spec

    assert isinstance(validate_spec(minimal_spec()), Spec)
    assert callable(load_spec)


def test_python_dash_m_geospec() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "geospec", "--version"], capture_output=True, text=True
    )
    assert result.returncode == 0 and "0.1.0" in result.stdout, result.stderr
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
