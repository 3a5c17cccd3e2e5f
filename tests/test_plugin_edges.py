"""Plugin edges, tried as a plugin author who read only the README: all-or-nothing registration,
a hook without its decorator, a misspelt hook, brief unknown-name messages, normalised names."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any, Literal

import pytest
from test_plugins import entry_point_dists  # noqa: F401  (a fixture: installed fake plugins)

from geospec import hookimpl
from geospec.errors import PluginError
from geospec.kinds import Geometry, Statistic
from geospec.plugin import PluginParams
from geospec.registry.entries import Provider
from geospec.registry.loading import build_registries, normalized


class Wavy(Geometry):
    class Params(PluginParams):
        kind: Literal["wavy"] = "wavy"


class Lumpy(Statistic):
    class Params(PluginParams):
        kind: Literal["lumpy"] = "lumpy"


def load(plugin: Any) -> Any:
    return build_registries(entry_points=False, extra=[(plugin, Provider("geospec-edge", "0.1"))])


def test_a_plugin_that_raises_half_way_is_not_registered_at_all() -> None:
    class HalfWay:
        @hookimpl
        def geospec_register_geometries(self, register: Any) -> None:
            register(Wavy)
            raise RuntimeError("out of ideas")

    registries = load(HalfWay())
    assert "wavy" not in registries["geometry"]
    [error] = registries.errors
    assert error.name == "geospec-edge" and "out of ideas" in error.error
    assert "geospec-edge" not in {p.name for p in registries.plugins}


def test_a_plugin_whose_second_hook_fails_loses_its_first_hook_too() -> None:
    class TwoHooks:
        @hookimpl
        def geospec_register_geometries(self, register: Any) -> None:
            register(Wavy)

        @hookimpl
        def geospec_register_statistics(self, register: Any) -> None:
            register(Lumpy)
            register(Lumpy)  # twice: refused

    registries = load(TwoHooks())
    assert "wavy" not in registries["geometry"] and "lumpy" not in registries["statistic"]
    [error] = registries.errors
    assert "registered twice" in error.error
    assert error.kinds == ("geometry", "statistic")
    assert "spherical" in registries["geometry"]  # the builtins are untouched


def test_a_hook_without_its_decorator_is_an_error_naming_it() -> None:
    module = types.ModuleType("geospec_undecorated")

    def geospec_register_geometries(register: Any) -> None:
        register(Wavy)

    module.geospec_register_geometries = geospec_register_geometries  # type: ignore[attr-defined]
    registries = load(module)
    [error] = registries.errors
    assert "geospec_register_geometries in geospec-edge is not marked with @geospec.hookimpl" in (
        error.error
    )
    assert "wavy" not in registries["geometry"]


def test_a_misspelt_hook_is_named_with_a_did_you_mean() -> None:
    class Typo:
        @hookimpl
        def geospec_register_statistic(self, register: Any) -> None:
            register(Lumpy)

    [error] = load(Typo()).errors
    assert error.error == (
        "unknown hook 'geospec_register_statistic' in geospec-edge; "
        "did you mean 'geospec_register_statistics'?"
    )


def test_unknown_names_mention_only_broken_plugins_that_could_provide_the_kind() -> None:
    class BrokenGeometries:
        @hookimpl
        def geospec_register_geometries(self, register: Any) -> None:
            raise RuntimeError("x" * 500)

    registries = load(BrokenGeometries())
    statistic = registries["statistic"].unknown_message("nothing-like-it")
    assert "geospec-edge" not in statistic  # it implements geometries only
    geometry = registries["geometry"].unknown_message("nothing-like-it")
    assert "geospec-edge 0.1 failed to load and may provide it" in geometry
    assert len(geometry) < 400  # brief: not the plugin's whole error
    assert "failed to load" not in registries["geometry"].unknown_message(
        "spherica"
    )  # did you mean
    with pytest.raises(PluginError, match="did you mean 'spherical'"):
        registries["geometry"].get("spherica")


def test_names_are_normalised() -> None:
    assert normalized("Geospec_CKA") == normalized("geospec.cka") == "geospec-cka"


@pytest.mark.parametrize(
    ("variable", "value", "loaded"),
    [
        ("GEOSPEC_PLUGINS", "GEOSPEC_GOOD", {"geospec-good"}),
        ("GEOSPEC_PLUGINS", "geospec.good", {"geospec-good"}),
        ("GEOSPEC_BLOCK_PLUGINS", "Geospec_Broken", {"geospec-good"}),
    ],
)
def test_environment_switches_normalise_names(
    entry_point_dists: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    variable: str,
    value: str,
    loaded: set[str],
) -> None:
    monkeypatch.setenv(variable, value)
    registries = build_registries()
    seen = {p.name for p in registries.plugins} | {e.name for e in registries.errors}
    assert seen - {"geospec"} == loaded


def test_minimal_spec_imports_without_pytest() -> None:
    import subprocess
    import sys

    script = (
        "import sys; sys.modules['pytest'] = None\n"
        "from geospec.testing import minimal_spec, registered\n"
        "assert minimal_spec()['name']\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
