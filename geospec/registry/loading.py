"""Discovering plugins and building the registries.

Builtins (the ``geospec_plugins`` package shipped in the wheel) and third-party packages (the
entry-point group ``geospec``) register through the same hooks. Each entry point is loaded on its
own: one that fails to import, implements a misspelled hook or raises while registering is recorded
as broken (name, version, error) and the others still load.

Environment switches:

- ``GEOSPEC_DISABLE_PLUGIN_AUTOLOAD=1``: load no entry points (builtins only).
- ``GEOSPEC_PLUGINS=a,b``: load only these entry points (by entry-point or distribution name).
- ``GEOSPEC_BLOCK_PLUGINS=a,b``: never load these (``geospec`` blocks the builtins).
"""

from __future__ import annotations

import contextlib
import contextvars
import difflib
import importlib
import json
import os
import re
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import pluggy

from geospec.errors import PluginError
from geospec.kinds import KINDS
from geospec.plugin_base import Plugin, PluginParams, as_table
from geospec.registry import hookspecs
from geospec.registry.entries import BrokenPlugin, Provider, Registry
from geospec.registry.files import load_plugin_module, plugin_files, sha256
from geospec.registry.hookspecs import REGISTER_HOOKS
from geospec.version import __version__

ENTRY_POINT_GROUP = "geospec"


def _from_source(dist: metadata.Distribution | None) -> bool:
    """Whether a distribution's modules are source files that may change under one version: an
    editable install (PEP 660's ``direct_url.json``), or no installed distribution at all (a
    checkout on ``sys.path``)."""
    if dist is None:
        return True
    try:
        direct = json.loads(dist.read_text("direct_url.json") or "{}")
    except ValueError:
        return False
    info = direct.get("dir_info") if isinstance(direct, dict) else None
    return isinstance(info, dict) and info.get("editable") is True


def _geospec_distribution() -> metadata.Distribution | None:
    try:
        dist = metadata.distribution("geospec")
    except metadata.PackageNotFoundError:
        return None
    # a checkout imported ahead of an installed geospec (PYTHONPATH) is in-tree source
    installed = Path(str(dist.locate_file("geospec"))).resolve()
    return dist if installed == Path(__file__).resolve().parents[1] else None


BUILTIN_PROVIDER = Provider("geospec", __version__, _from_source(_geospec_distribution()))


@dataclass(frozen=True)
class PluginInfo:
    """A loaded plugin package and what it registered, by kind."""

    name: str
    version: str | None
    kinds: dict[str, list[str]]
    from_source: bool = False
    """Runs from source that may change under one version (editable, in-tree, a file)."""
    path: str | None = None
    """The plugin file, for plugins loaded from one."""

    def describe(self) -> dict[str, Any]:
        """Its entry in ``plugins.json`` and ``geospec plugins --json``: a plugin file also
        with its path and sha256."""
        record: dict[str, Any] = {"name": self.name, "version": self.version, "kinds": self.kinds}
        record["from_source"] = self.from_source
        if self.path is not None:
            record["path"] = self.path
            record["sha256"] = sha256(Path(self.path)) if Path(self.path).is_file() else None
        return record


@dataclass
class Registries:
    """All registries, plus what was loaded and what failed."""

    by_kind: dict[str, Registry]
    plugins: list[PluginInfo] = field(default_factory=list)
    errors: list[BrokenPlugin] = field(default_factory=list)

    def __getitem__(self, kind: str) -> Registry:
        return self.by_kind[kind]

    def params(self, kind: str, value: Any, context: Any = None) -> PluginParams:
        """Validate a plugin table of ``kind`` (a kind name, a table or ``Params``) with the
        ``Params`` of the plugin it names. Raises :class:`PluginTableError` when ``value`` names
        no plugin, :class:`PluginError` for an unknown name (listing the available ones) and
        pydantic's ``ValidationError`` for bad parameters."""
        table = as_table(kind, value)
        cls = self.by_kind[kind].get(table["kind"]).cls
        return cls.Params.model_validate(table, context=context)

    def all_measures(self) -> list[tuple[str, str]]:
        """Every registered (statistic, geometry) pair, statistic-major: what ``measure =
        "all"`` (a spec's default) measures."""
        return [
            (statistic, geometry)
            for statistic in self.by_kind["statistic"].names()
            for geometry in self.by_kind["geometry"].names()
        ]

    def create(self, kind: str, value: Any) -> Any:
        """The plugin instance of ``kind`` that ``value`` names (see :meth:`params`)."""
        params = self.params(kind, value)
        return self.by_kind[kind].get(params.kind).cls(params)

    def describe(self) -> dict[str, Any]:
        """The stable machine-readable form printed by ``geospec plugins --json``."""
        return {
            "plugins": [plugin.describe() for plugin in self.plugins],
            "errors": [
                {"name": e.name, "version": e.version, "error": e.error} for e in self.errors
            ],
        }


def normalized(name: str) -> str:
    """A distribution or entry-point name as PEP 503 compares them: case, ``-``, ``_`` and ``.``
    do not matter (``GEOSPEC_PLUGINS=Geospec_CKA`` names ``geospec-cka``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _env_list(name: str) -> set[str] | None:
    value = os.environ.get(name)
    if value is None:
        return None
    return {normalized(item.strip()) for item in value.split(",") if item.strip()}


def _truthy(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def _builtin_modules() -> list[Any]:
    try:
        package = importlib.import_module("geospec_plugins")
    except ModuleNotFoundError as error:
        if error.name == "geospec_plugins":
            return []  # the core works without its builtins; it just has nothing registered
        raise
    return [importlib.import_module(name) for name in package.BUILTIN_MODULES]


def new_plugin_manager() -> pluggy.PluginManager:
    pm = pluggy.PluginManager("geospec")
    pm.add_hookspecs(hookspecs)
    return pm


class _Loader:
    """Registers plugin objects one at a time, recording each one's provider or failure."""

    def __init__(self, pm: pluggy.PluginManager) -> None:
        self.pm = pm
        self.providers: dict[str, Provider] = {}
        self.errors: list[BrokenPlugin] = []

    def add(self, obj: Any, plugin_name: str, provider: Provider) -> None:
        problem = _hook_problem(obj, provider)
        if problem is not None:
            self.errors.append(BrokenPlugin(provider.name, provider.version, problem))
            return
        try:
            self.pm.register(obj, name=plugin_name)
            self.pm.check_pending()  # a hook implementation with no matching spec: misspelled
        except Exception as error:  # one bad plugin must not stop the others
            if self.pm.is_registered(obj):
                self.pm.unregister(obj)
            self.errors.append(BrokenPlugin(provider.name, provider.version, _describe(error)))
            return
        self.providers[plugin_name] = provider

    def load_entry_points(self) -> None:
        allow = _env_list("GEOSPEC_PLUGINS")
        block = _env_list("GEOSPEC_BLOCK_PLUGINS") or set()
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
            dist = ep.dist
            dist_name = dist.metadata["Name"] if dist is not None else ep.name
            version = dist.version if dist is not None else None
            names = {normalized(ep.name), normalized(dist_name)}
            if names & block or (allow is not None and not names & allow):
                continue
            provider = Provider(dist_name, version, _from_source(dist))
            try:
                obj = ep.load()
            except Exception as error:
                self.errors.append(BrokenPlugin(dist_name, version, _describe(error)))
                continue
            self.add(obj, f"{dist_name}:{ep.name}", provider)

    def load_files(self) -> None:
        """The plugin files in effect (:mod:`geospec.registry.files`), each like an entry point."""
        for path in plugin_files():
            provider = Provider(path.name, None, from_source=True, path=str(path))
            try:
                module = load_plugin_module(path)
            except Exception as error:
                self.errors.append(BrokenPlugin(path.name, None, _describe(error)))
                continue
            self.add(module, f"file:{path}", provider)


def _hook_problem(obj: Any, provider: Provider) -> str | None:
    """A hook a plugin meant to implement but that pluggy would not call: a function named like a
    hook but not marked ``@geospec.hookimpl``, or a marked one whose name is no hook."""
    for name in sorted(n for n in dir(obj) if n.startswith("geospec_")):
        function = getattr(obj, name, None)
        if not callable(function):
            continue
        marked = hasattr(function, "geospec_impl")  # what pluggy's HookimplMarker sets
        if name in REGISTER_HOOKS and not marked:
            return (
                f"{name} in {provider.name} is not marked with @geospec.hookimpl, so it would "
                "never be called; add the decorator"
            )
        if name not in REGISTER_HOOKS and marked:
            close = difflib.get_close_matches(name, list(REGISTER_HOOKS), n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            return f"unknown hook {name!r} in {provider.name}{hint}"
    return None


def _describe(error: BaseException) -> str:
    text = "".join(traceback.format_exception_only(type(error), error)).strip()
    return " ".join(text.split())


def build_registries(
    pm: pluggy.PluginManager | None = None,
    *,
    builtins: bool = True,
    entry_points: bool | None = None,
    extra: list[tuple[Any, Provider]] | None = None,
) -> Registries:
    """Load plugins and collect what they register.

    ``entry_points=None`` follows ``GEOSPEC_DISABLE_PLUGIN_AUTOLOAD``. ``extra`` registers further
    plugin objects (tests use it to add a plugin defined inline).
    """
    pm = pm or new_plugin_manager()
    loader = _Loader(pm)
    block = _env_list("GEOSPEC_BLOCK_PLUGINS") or set()
    if builtins and normalized(BUILTIN_PROVIDER.name) not in block:
        for module in _builtin_modules():
            loader.add(module, module.__name__, BUILTIN_PROVIDER)
    if entry_points is None:
        entry_points = not _truthy("GEOSPEC_DISABLE_PLUGIN_AUTOLOAD")
    if entry_points:
        loader.load_entry_points()
    loader.load_files()  # named explicitly (a spec's plugins, --plugin): not autoloading
    for obj, provider in extra or []:
        loader.add(obj, f"{provider.name}:{id(obj)}", provider)
    return _collect(pm, loader)


def _collect(pm: pluggy.PluginManager, loader: _Loader) -> Registries:
    """Call each plugin's hooks, in load order (the builtins first, so they claim their names
    first). A plugin is registered whole or not at all: if one of its hooks raises, or one of its
    classes is refused (a duplicate name, not a subclass of its kind), none of its classes stay."""
    registries = {kind: Registry(kind, base) for kind, base in KINDS.items()}
    errors = list(loader.errors)
    plugins: dict[Provider, dict[str, list[str]]] = {}
    for plugin_name, provider in loader.providers.items():
        staged: list[tuple[str, type[Plugin]]] = []
        implemented: list[str] = []
        registered: list[tuple[str, str]] = []
        try:
            for hook_name, kind in REGISTER_HOOKS.items():
                for impl in getattr(pm.hook, hook_name).get_hookimpls():
                    if impl.plugin_name != plugin_name:
                        continue
                    implemented.append(kind)
                    try:
                        impl.function(
                            register=lambda cls, k=kind, into=staged: into.append((k, cls))
                        )
                    except Exception as error:
                        raise PluginError(f"{hook_name}: {_describe(error)}") from error
            for kind, cls in staged:
                registries[kind].register(cls, provider)
                registered.append((kind, cls.kind_name()))
        except PluginError as error:
            for kind, name in registered:  # all or nothing
                del registries[kind].entries[name]
            errors.append(
                BrokenPlugin(provider.name, provider.version, str(error), tuple(implemented))
            )
            continue
        kinds = plugins.setdefault(provider, {kind: [] for kind in KINDS})
        for kind, name in registered:
            kinds[kind].append(name)
    for registry in registries.values():
        registry.broken = errors
    infos = [
        PluginInfo(p.name, p.version, kinds, p.from_source, p.path) for p, kinds in plugins.items()
    ]
    return Registries(registries, infos, errors)


_current: contextvars.ContextVar[Registries | None] = contextvars.ContextVar(
    "geospec_registries", default=None
)
_default: Registries | None = None
_default_files: list[Path] = []


def get_registries() -> Registries:
    """The registries in effect: those set by :func:`use_registries`, else the installed plugins
    (with the plugin files in effect: built again when they change)."""
    global _default, _default_files
    current = _current.get()
    if current is not None:
        return current
    if _default is None or _default_files != plugin_files():
        _default_files = plugin_files()
        _default = build_registries()
    return _default


@contextlib.contextmanager
def use_registries(registries: Registries) -> Iterator[Registries]:
    """Make ``registries`` the ones validation and the pipeline use, within the block."""
    token = _current.set(registries)
    try:
        yield registries
    finally:
        _current.reset(token)


def reset_default_registries() -> None:
    """Forget the cached registries (after installing or removing plugins in-process)."""
    global _default
    _default = None
