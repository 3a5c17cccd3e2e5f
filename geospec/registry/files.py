"""Plugins from Python files: a quick experiment without making a package first.

A spec's ``plugins = ["my_geometry.py"]`` (paths relative to the spec file) or a command's
``--plugin my_geometry.py`` names modules whose ``@geospec.hookimpl`` hooks register plugins
exactly as an installed package's entry point does. The files in effect are kept in the
environment variable ``GEOSPEC_PLUGIN_FILES`` (absolute paths separated by ``os.pathsep``), so
the processes geospec starts (measure workers, pool launchers) load them too; each file is
imported as a module named after it, its folder added at the end of ``sys.path`` so those
processes can unpickle its classes. ``plugins.json`` records every file with its sha256.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType

from geospec.errors import UsageError

PLUGIN_FILES_ENV = "GEOSPEC_PLUGIN_FILES"


def plugin_files() -> list[Path]:
    """The plugin files in effect, in the order they were named."""
    value = os.environ.get(PLUGIN_FILES_ENV, "")
    return [Path(item) for item in value.split(os.pathsep) if item]


def sha256(path: Path) -> str:
    """The file's content hash as plugins.json records it (``sha256:<hex>``)."""
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def use_plugin_files(paths: Iterable[str | Path], named_by: str) -> None:
    """Add ``paths`` to the plugin files in effect, once each, after checking every one: it
    exists, is a ``.py`` file, imports and holds a ``@geospec.hookimpl`` hook. ``named_by``
    says where the path was given (``--plugin``, ``spec.toml: plugins``) in the one-line
    :class:`UsageError` that refuses a file."""
    files = plugin_files()
    for given in paths:
        path = Path(given).expanduser().resolve()
        if not path.is_file():
            raise UsageError(f"{named_by}: plugin file {given} does not exist")
        if path.suffix != ".py":
            raise UsageError(f"{named_by}: plugin file {given} is not a Python file (.py)")
        try:
            module = load_plugin_module(path)
        except UsageError as error:
            raise UsageError(f"{named_by}: {error}") from None
        except Exception as error:
            raise UsageError(
                f"{named_by}: plugin file {given} fails to import: {type(error).__name__}: {error}"
            ) from None
        if not hook_names(module):
            raise UsageError(
                f"{named_by}: plugin file {given} has no @geospec.hookimpl hook "
                "(geospec_register_geometries, ...): it registers nothing"
            )
        if path not in files:
            files.append(path)
    os.environ[PLUGIN_FILES_ENV] = os.pathsep.join(str(f) for f in files)  # the registries
    # in effect are rebuilt when this changes (geospec.registry.loading.get_registries)


def hook_names(module: ModuleType) -> list[str]:
    """The names of the module's functions marked ``@geospec.hookimpl``."""
    return [
        name
        for name in dir(module)
        if name.startswith("geospec_") and hasattr(getattr(module, name), "geospec_impl")
    ]


def load_plugin_module(path: Path) -> ModuleType:
    """The module of plugin file ``path``, imported once, under the file's name."""
    name = path.stem
    loaded = sys.modules.get(name)
    if loaded is not None:
        if Path(getattr(loaded, "__file__", "") or "").resolve() == path:
            return loaded
        raise UsageError(
            f"plugin file {path} would be imported as {name!r}, which would hide the module "
            f"{getattr(loaded, '__file__', None) or name} already imported; rename the file"
        )
    found = importlib.util.find_spec(name)
    if found is not None and found.origin is not None and Path(found.origin).resolve() != path:
        raise UsageError(
            f"plugin file {path} would be imported as {name!r}, which would hide the module "
            f"{found.origin}; rename the file"
        )
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise UsageError(f"plugin file {path} cannot be imported")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # pydantic and pickle find the module's classes by its name
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    if str(path.parent) not in sys.path:
        sys.path.append(str(path.parent))  # spawned workers import it by name
    return module
