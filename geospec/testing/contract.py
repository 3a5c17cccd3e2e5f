"""What every contract check shares: the error it raises and how it builds the plugin."""

from __future__ import annotations

from typing import Any, TypeVar

from geospec.plugin_base import Plugin

P = TypeVar("P", bound=Plugin)


class ContractError(AssertionError):
    """A plugin breaks its kind's contract; the message names the plugin and the rule."""


def plugin_instance(cls: type[Any], kind: type[P], params: dict[str, Any] | None) -> P:
    """``cls(params)`` once ``cls`` is a subclass of its kind's contract with a valid ``Params``
    (docs/plugins.md: "every plugin"); :class:`ContractError` otherwise."""
    from geospec.plugin_base import kind_of

    if not (isinstance(cls, type) and issubclass(cls, kind)):
        raise ContractError(f"{cls!r} is not a geospec.kinds.{kind.__name__} subclass")
    try:
        kind_of(cls)
    except TypeError as error:
        raise ContractError(str(error)) from None
    return cls(cls.Params.model_validate(params or {}))


def rule(plugin: Any, broken: bool, text: str) -> None:
    """Raise :class:`ContractError` "<name>: <text>" when ``broken``: ``text`` states the rule
    (and what was found)."""
    if broken:
        raise ContractError(f"{type(plugin).kind_name()}: {text}")
