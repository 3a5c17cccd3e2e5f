"""What every plugin is: a class with a pydantic ``Params`` model whose literal ``kind`` names it.

A spec names a plugin by a table, ``geometry = { kind = "hyperbolic", radius = 0.9 }``; validation
finds the class registered under ``kind`` and validates the table with its ``Params``. The
instance the pipeline uses is ``cls(params)``.

This module is below the registry (which registers these classes); plugin authors import its
names from :mod:`geospec.plugin`, which adds what needs the registry.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, SerializerFunctionWrapHandler, model_serializer

#: The callback every ``geospec_register_*`` hook receives: call it with each plugin class.
Register = Callable[[type[Any]], None]


class AddedLater:
    """Marks an option added after run keys were first recorded: keys leave it out while it has
    its default (the behaviour from before it existed), so adding it retrains nothing. On a spec
    section (:meth:`geospec.spec.sections.Section.key_form`) and on a plugin's ``Params`` (its
    dump leaves the option out at its default: a ``[[prune.arms]]`` schedule table is part of
    the prune's key)."""


ADDED_LATER = AddedLater()


class PluginParams(BaseModel):
    """Base of every plugin's ``Params``: strict (unknown keys are errors) and immutable.

    Subclasses declare ``kind: Literal["name"] = "name"`` and their own constrained, documented
    fields (``Field(..., description=...)`` or attribute docstrings).
    """

    model_config = ConfigDict(
        extra="forbid", frozen=True, use_attribute_docstrings=True, allow_inf_nan=False
    )

    kind: str

    @model_serializer(mode="wrap")
    def _without_later_defaults(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """The table, less the options added later (:class:`AddedLater`) at their defaults: the
        dump run keys hash, as it was before those options existed."""
        dumped: dict[str, Any] = handler(self)
        for name, field in type(self).model_fields.items():
            later = any(isinstance(marker, AddedLater) for marker in field.metadata)
            if later and getattr(self, name) == field.get_default(call_default_factory=True):
                dumped.pop(name, None)
        return dumped


class Plugin:
    """Base of every plugin class: ``Params`` is its parameter model, ``params`` the values."""

    Params: ClassVar[type[PluginParams]]
    #: The hook that registers plugins of this kind (set by each contract in geospec.kinds).
    register_hook: ClassVar[str]

    def __init__(self, params: PluginParams | None = None) -> None:
        self.params = params if params is not None else self.Params.model_validate({})

    @classmethod
    def kind_name(cls) -> str:
        """The name this class is registered under: the literal default of ``Params.kind``."""
        return kind_of(cls)

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in self.params.model_dump().items() if k != "kind")
        return f"{type(self).__name__}({fields})"


def kind_of(cls: Any) -> str:
    """Read the kind name a plugin class declares, or raise ``TypeError`` saying what is missing."""
    params = getattr(cls, "Params", None)
    if not (isinstance(params, type) and issubclass(params, BaseModel)):
        raise TypeError(f"{cls!r} has no pydantic Params model")
    field = params.model_fields.get("kind")
    if field is None:
        raise TypeError(f"{cls.__name__}.Params has no 'kind' field")
    literal_values = typing.get_args(field.annotation) if _is_literal(field.annotation) else ()
    if len(literal_values) != 1 or field.default != literal_values[0]:
        raise TypeError(
            f"{cls.__name__}.Params.kind must be declared as kind: Literal['name'] = 'name'"
        )
    value = literal_values[0]
    if not isinstance(value, str) or not value:
        raise TypeError(f"{cls.__name__}.Params.kind must be a non-empty string literal")
    return value


def _is_literal(annotation: Any) -> bool:
    return typing.get_origin(annotation) is typing.Literal


class PluginTableError(ValueError):
    """A value that does not name a plugin of a kind; the message says what is expected."""


def as_table(kind: str, value: Any) -> dict[str, Any]:
    """A plugin named by its kind (``"raw"``), a table (``{"kind": "gw", ...}``) or validated
    ``Params``, as a table with a ``kind`` string; or :class:`PluginTableError` saying why not."""
    if isinstance(value, PluginParams):
        value = value.model_dump()
    if isinstance(value, str):
        value = {"kind": value}
    if not isinstance(value, Mapping):
        raise PluginTableError(
            f'a {kind} is named by its kind or a table such as {{ kind = "..." }}, '
            f"not {type(value).__name__}"
        )
    if not isinstance(value.get("kind"), str):
        raise PluginTableError(f"a {kind} table needs a 'kind' key naming the {kind}")
    return dict(value)
