"""One registry per plugin kind: name -> plugin class, remembering which package provided it."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from geospec.errors import PluginError
from geospec.plugin_base import Plugin, kind_of


def _first_words(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class Provider:
    """Who provided a plugin: the plugin's registered name and its distribution's version.

    ``from_source``: the plugin runs from source files that may change under the same version
    (an editable install, an in-tree module, a plugin file), so its provenance holds a hash of
    its module's source too. ``path``: the plugin file, for a plugin loaded from one."""

    name: str
    version: str | None = None
    from_source: bool = field(default=False, compare=False)
    path: str | None = field(default=None, compare=False)

    def __str__(self) -> str:
        return f"{self.name} {self.version}" if self.version else self.name


@dataclass(frozen=True)
class Entry:
    name: str
    cls: type[Plugin]
    provider: Provider

    def provenance(self) -> dict[str, str | None]:
        """What the plugin's results depend on besides its params: its distribution's name and
        version, and the hash of its module's source where that source may change under one
        version (:attr:`Provider.from_source`). The measure key holds it, so a changed plugin
        re-measures what it measures."""
        record: dict[str, str | None] = {
            "distribution": self.provider.name,
            "version": self.provider.version,
        }
        if self.provider.from_source:
            record["source"] = source_digest(self.cls)
        return record


def source_digest(cls: type[Any]) -> str:
    """The sha256 of the source file of the module defining ``cls`` (of its source text when
    the module has no file: a class defined interactively)."""
    import hashlib
    import inspect

    try:
        path = inspect.getsourcefile(cls)
        data = Path(path).read_bytes() if path else inspect.getsource(cls).encode()
    except (OSError, TypeError):
        data = f"{cls.__module__}.{cls.__qualname__}".encode()  # no source to read
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class BrokenPlugin:
    """A plugin that failed to load, and the kinds it implements hooks for (None when it failed
    before that was known, at import: it might have provided any kind)."""

    name: str
    version: str | None
    error: str
    kinds: tuple[str, ...] | None = None


@dataclass
class Registry:
    """Plugins of one kind (``geometry``, ``statistic``, ...), by name."""

    kind: str
    base: type[Plugin]
    entries: dict[str, Entry] = field(default_factory=dict)
    broken: list[BrokenPlugin] = field(default_factory=list)

    def register(self, cls: type[Plugin], provider: Provider) -> None:
        if not (isinstance(cls, type) and issubclass(cls, self.base)):
            raise PluginError(
                f"plugin {provider} registered {cls!r} as a {self.kind}, "
                f"but it is not a subclass of {self.base.__module__}.{self.base.__name__}"
            )
        try:
            name = kind_of(cls)
        except TypeError as error:
            raise PluginError(f"plugin {provider}: {error}") from None
        existing = self.entries.get(name)
        if existing is not None:
            raise PluginError(
                f"{self.kind} {name!r} is registered twice: by {existing.provider} "
                f"({existing.cls.__module__}.{existing.cls.__name__}) and by {provider} "
                f"({cls.__module__}.{cls.__name__}); uninstall or block one of them "
                "(GEOSPEC_BLOCK_PLUGINS)"
            )
        self.entries[name] = Entry(name, cls, provider)

    def names(self) -> list[str]:
        return list(self.entries)

    def __contains__(self, name: object) -> bool:
        return name in self.entries

    def get(self, name: str) -> Entry:
        entry = self.entries.get(name)
        if entry is None:
            raise PluginError(self.unknown_message(name))
        return entry

    def unknown_message(self, name: str) -> str:
        """Explain an unknown name: what is available, the closest match, broken plugins."""
        close = difflib.get_close_matches(name, list(self.entries), n=1, cutoff=0.6)
        if not self.entries:
            message = f"unknown {self.kind} {name!r}: no {self.kind} plugins are registered"
        else:
            available = ", ".join(repr(n) for n in self.entries)
            message = f"unknown {self.kind} {name!r}; available: {available}"
            if close:
                return message + f"; did you mean {close[0]!r}?"
        # only plugins that could have provided this kind, briefly (geospec plugins says why)
        for plugin in self.broken:
            if plugin.kinds is None or self.kind in plugin.kinds:
                version = f" {plugin.version}" if plugin.version else ""
                message += (
                    f"; plugin {plugin.name}{version} failed to load and may provide it: "
                    f"{_first_words(plugin.error)} (see geospec plugins)"
                )
        return message
