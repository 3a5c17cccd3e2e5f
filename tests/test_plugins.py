"""Registries and plugin discovery: duplicates, unknown names, broken plugins, env switches."""

from __future__ import annotations

import hashlib
import inspect
import json
import sys
import types
from pathlib import Path
from typing import Literal

import pytest
from click.testing import CliRunner

from geospec import hookimpl
from geospec.cli import cli
from geospec.errors import PluginError, SpecError
from geospec.kinds import KINDS, Geometry, Statistic
from geospec.plugin import PluginParams
from geospec.registry import hookspecs
from geospec.registry.entries import Provider
from geospec.registry.loading import build_registries, new_plugin_manager, use_registries
from geospec.spec.loading import validate_spec
from geospec.testing import minimal_spec, registered


class Constant(Statistic):
    """A statistic defined inside the test: always 1.0."""

    class Params(PluginParams):
        kind: Literal["constant"] = "constant"
        value: float = 1.0

    def __call__(self, geometry: object, x: object, y: object) -> float:
        return float(self.params.value)  # type: ignore[attr-defined]


class Flat(Geometry):
    class Params(PluginParams):
        kind: Literal["flat"] = "flat"


class ConstantPlugin:
    @hookimpl
    def geospec_register_statistics(self, register):  # type: ignore[no-untyped-def]
        register(Constant)

    @hookimpl
    def geospec_register_geometries(self, register):  # type: ignore[no-untyped-def]
        register(Flat)


def test_builtins_register_through_hooks() -> None:
    registries = build_registries(entry_points=False)
    assert {"uniform", "cosine"} <= set(registries["schedule"].names())
    entry = registries["schedule"].get("cosine")
    assert entry.provider.name == "geospec"
    assert registries.errors == []


def test_plugin_registered_inside_test_is_visible_only_inside_block() -> None:
    spec = minimal_spec(measure=[{"geometry": {"kind": "flat"}, "statistic": {"kind": "constant"}}])
    with registered(ConstantPlugin()) as registries:
        assert registries["statistic"].get("constant").provider == Provider("test-plugin", "0.0.0")
        assert validate_spec(spec).measure[0].statistic.value == 1.0  # type: ignore[union-attr]
    with pytest.raises(SpecError, match="unknown statistic 'constant'"):
        validate_spec(spec)


def test_register_plugin_fixture(register_plugin) -> None:  # type: ignore[no-untyped-def]
    with register_plugin(ConstantPlugin()) as registries:
        assert "flat" in registries["geometry"]


def test_duplicate_name_is_an_error_naming_both_providers() -> None:
    class Again(Statistic):
        class Params(PluginParams):
            kind: Literal["constant"] = "constant"

    class Duplicate:
        @hookimpl
        def geospec_register_statistics(self, register):  # type: ignore[no-untyped-def]
            register(Again)

    registries = build_registries(
        entry_points=False,
        extra=[
            (ConstantPlugin(), Provider("first", "1.0")),
            (Duplicate(), Provider("second", "2.0")),
        ],
    )
    assert registries["statistic"].get("constant").cls is Constant
    [error] = registries.errors
    assert error.name == "second"
    assert "first 1.0" in error.error and "second 2.0" in error.error


def test_unknown_name_lists_available_and_suggests() -> None:
    registries = build_registries(entry_points=False)
    with pytest.raises(PluginError) as info:
        registries["schedule"].get("cosin")
    assert "'uniform'" in str(info.value) and "did you mean 'cosine'?" in str(info.value)


def test_misspelled_hook_fails_loudly() -> None:
    class Misspelled:
        @hookimpl
        def geospec_register_geometry(self, register):  # type: ignore[no-untyped-def]
            register(Flat)

    registries = build_registries(
        entry_points=False, extra=[(Misspelled(), Provider("typo", "0.1"))]
    )
    [error] = registries.errors
    assert error.name == "typo"
    assert "geospec_register_geometry" in error.error
    assert "flat" not in registries["geometry"]


def test_registering_a_non_plugin_class_is_reported() -> None:
    class NotAPlugin:
        pass

    class Bad:
        @hookimpl
        def geospec_register_geometries(self, register):  # type: ignore[no-untyped-def]
            register(NotAPlugin)

    registries = build_registries(entry_points=False, extra=[(Bad(), Provider("bad", "0"))])
    assert "not a subclass" in registries.errors[0].error


def test_kind_must_be_a_literal_with_default() -> None:
    class NoLiteral(Geometry):
        class Params(PluginParams):
            kind: str = "x"

    class Bad:
        @hookimpl
        def geospec_register_geometries(self, register):  # type: ignore[no-untyped-def]
            register(NoLiteral)

    registries = build_registries(entry_points=False, extra=[(Bad(), Provider("bad", "0"))])
    assert "Literal" in registries.errors[0].error


def _fake_entry_point_dist(tmp_path: Path, name: str, module_source: str) -> None:
    """Install a tiny distribution with a `geospec` entry point onto sys.path (no pip needed)."""
    module = name.replace("-", "_")
    (tmp_path / f"{module}.py").write_text(inspect.cleandoc(module_source))
    dist = tmp_path / f"{module}-1.2.3.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.2.3\n")
    (dist / "entry_points.txt").write_text(f"[geospec]\n{name} = {module}\n")


@pytest.fixture
def entry_point_dists(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    _fake_entry_point_dist(
        tmp_path,
        "geospec-good",
        """
        from typing import Literal
        from geospec import hookimpl
        from geospec.kinds import Statistic
        from geospec.plugin import PluginParams

        class Spread(Statistic):
            class Params(PluginParams):
                kind: Literal["spread"] = "spread"

        @hookimpl
        def geospec_register_statistics(register):
            register(Spread)
        """,
    )
    _fake_entry_point_dist(tmp_path, "geospec-broken", "raise ImportError('needs libfoo')")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("GEOSPEC_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    yield tmp_path
    for module in ("geospec_good", "geospec_broken"):
        sys.modules.pop(module, None)


def test_entry_points_load_each_on_its_own(entry_point_dists: Path) -> None:
    registries = build_registries()
    assert registries["statistic"].get("spread").provider == Provider("geospec-good", "1.2.3")
    [error] = registries.errors
    assert (error.name, error.version) == ("geospec-broken", "1.2.3")
    assert "needs libfoo" in error.error
    described = registries.describe()
    assert {
        "name": "geospec-good",
        "version": "1.2.3",
        "kinds": {
            "geometry": [],
            "statistic": ["spread"],
            "smoother": [],
            "solver": [],
            "schedule": [],
            "launcher": [],
            "tracker": [],
            "importance": [],
        },
        "from_source": False,  # installed as a wheel: its version says what it computes
    } in described["plugins"]


def test_spec_using_missing_kind_names_the_broken_plugin(entry_point_dists: Path) -> None:
    spec = minimal_spec(arms=[{"name": "uniform", "schedule": {"kind": "fancy"}}])
    with use_registries(build_registries()), pytest.raises(SpecError) as info:
        validate_spec(spec)
    assert "geospec-broken 1.2.3 failed to load" in str(info.value)
    assert "needs libfoo" in str(info.value)


@pytest.mark.parametrize(
    ("env", "loaded"),
    [
        ({"GEOSPEC_DISABLE_PLUGIN_AUTOLOAD": "1"}, set()),
        ({"GEOSPEC_PLUGINS": "geospec-good"}, {"geospec-good"}),
        ({"GEOSPEC_BLOCK_PLUGINS": "geospec-broken"}, {"geospec-good"}),
        ({}, {"geospec-good", "geospec-broken"}),
    ],
)
def test_environment_switches(
    entry_point_dists: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], loaded: set[str]
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    registries = build_registries()
    seen = {p.name for p in registries.plugins} | {e.name for e in registries.errors}
    assert seen - {"geospec"} == loaded


def test_block_list_can_remove_builtins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GEOSPEC_BLOCK_PLUGINS", "geospec")
    registries = build_registries(entry_points=False)
    assert registries["schedule"].names() == []


def test_plugins_json_shape(entry_point_dists: Path) -> None:
    from geospec.registry import loading as plugins_module

    plugins_module.reset_default_registries()
    try:
        result = CliRunner().invoke(cli, ["plugins", "--json"])
    finally:
        plugins_module.reset_default_registries()
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert set(data) == {"plugins", "errors"}
    for plugin in data["plugins"]:
        assert set(plugin) == {"name", "version", "kinds", "from_source"}
        assert set(plugin["kinds"]) == set(KINDS)
    assert data["errors"][0]["name"] == "geospec-broken"
    assert "needs libfoo" in data["errors"][0]["error"]


def test_every_hook_is_documented_and_tested() -> None:
    """Like datasette: a hook without docs, or one no test exercises, fails here.

    "Tested" means a test module other than this one implements the hook, so that a plugin
    registered through it is used by the feature it plugs into (this file only registers).
    """
    pm = new_plugin_manager()
    hook_names = [name for name in dir(pm.hook) if name.startswith("geospec_")]
    assert set(hook_names) == set(hookspecs.REGISTER_HOOKS)
    docs = (Path(__file__).parents[1] / "README.md").read_text()
    here = Path(__file__).resolve()
    others = [p for p in here.parent.rglob("test_*.py") if p.resolve() != here]
    for name in hook_names:
        spec_function = getattr(hookspecs, name)
        assert inspect.getdoc(spec_function), f"{name} has no docstring"
        assert name in docs, f"{name} is not documented in README.md"
        users = [p.name for p in others if f"def {name}(" in p.read_text()]
        assert users, f"no test outside {here.name} implements {name}"


def test_one_plugin_can_implement_every_hook() -> None:
    from geospec.kinds import Importance, Launcher, Schedule, Smoother, Solver, Tracker

    def plugin_class(base: type, name: str) -> type:
        params = type(
            "Params", (PluginParams,), {"__annotations__": {"kind": Literal[name]}, "kind": name}
        )
        return type(name.title(), (base,), {"Params": params})

    classes = {
        kind: plugin_class(base, f"my-{kind}")
        for kind, base in [
            ("geometry", Geometry),
            ("statistic", Statistic),
            ("smoother", Smoother),
            ("solver", Solver),
            ("schedule", Schedule),
            ("launcher", Launcher),
            ("tracker", Tracker),
            ("importance", Importance),
        ]
    }

    class Everything:
        @hookimpl
        def geospec_register_geometries(self, register):  # type: ignore[no-untyped-def]
            register(classes["geometry"])

        @hookimpl
        def geospec_register_statistics(self, register):  # type: ignore[no-untyped-def]
            register(classes["statistic"])

        @hookimpl
        def geospec_register_smoothers(self, register):  # type: ignore[no-untyped-def]
            register(classes["smoother"])

        @hookimpl
        def geospec_register_solvers(self, register):  # type: ignore[no-untyped-def]
            register(classes["solver"])

        @hookimpl
        def geospec_register_schedules(self, register):  # type: ignore[no-untyped-def]
            register(classes["schedule"])

        @hookimpl
        def geospec_register_launchers(self, register):  # type: ignore[no-untyped-def]
            register(classes["launcher"])

        @hookimpl
        def geospec_register_trackers(self, register):  # type: ignore[no-untyped-def]
            register(classes["tracker"])

        @hookimpl
        def geospec_register_importances(self, register):  # type: ignore[no-untyped-def]
            register(classes["importance"])

    with registered(Everything(), name="everything") as registries:
        [info] = [p for p in registries.plugins if p.name == "everything"]
        assert info.kinds == {kind: [f"my-{kind}"] for kind in classes}
        for kind, cls in classes.items():
            assert registries[kind].get(f"my-{kind}").cls is cls


def test_core_imports_without_builtins(monkeypatch: pytest.MonkeyPatch) -> None:
    """Deleting plugins/ leaves a core that reports nothing registered instead of crashing."""
    monkeypatch.setitem(sys.modules, "geospec_plugins", None)  # makes the import fail
    registries = build_registries(entry_points=False)
    assert all(not r.entries for r in registries.by_kind.values())
    with pytest.raises(PluginError, match="no geometry plugins are registered"):
        registries["geometry"].get("hyperbolic")


def test_statistic_from_module_plugin() -> None:
    module = types.ModuleType("module_plugin")

    @hookimpl
    def geospec_register_statistics(register):  # type: ignore[no-untyped-def]
        register(Constant)

    module.geospec_register_statistics = geospec_register_statistics  # type: ignore[attr-defined]
    registries = build_registries(entry_points=False, extra=[(module, Provider("mod", "1"))])
    assert "constant" in registries["statistic"]


def test_an_editable_plugin_s_provenance_holds_its_source_hash_and_a_wheel_s_its_version(
    entry_point_dists: Path,
) -> None:
    """PEP 610/660: an editable install's direct_url.json says ``dir_info.editable``; its
    code may change under one version, so its provenance hashes the module's source."""
    registries = build_registries()
    assert registries["statistic"].get("spread").provenance() == {
        "distribution": "geospec-good",
        "version": "1.2.3",
    }  # a wheel: the version says what it computes
    [dist_info] = entry_point_dists.glob("geospec_good*.dist-info")
    (dist_info / "direct_url.json").write_text(
        json.dumps({"url": "file:///src/geospec-good", "dir_info": {"editable": True}})
    )
    sys.modules.pop("geospec_good", None)
    source = entry_point_dists / "geospec_good.py"
    provenance = build_registries()["statistic"].get("spread").provenance()
    assert provenance == {
        "distribution": "geospec-good",
        "version": "1.2.3",
        "source": "sha256:" + hashlib.sha256(source.read_bytes()).hexdigest(),
    }
    described = {p["name"]: p for p in build_registries().describe()["plugins"]}
    assert described["geospec-good"]["from_source"] is True
