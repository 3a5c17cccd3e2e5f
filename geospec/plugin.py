"""What every plugin is: a class with a pydantic ``Params`` model whose literal ``kind`` names it.

A spec names a plugin by a table, ``geometry = { kind = "hyperbolic", radius = 0.9 }``; validation
finds the class registered under ``kind`` and validates the table with its ``Params``. The
instance the pipeline uses is ``cls(params)``.
"""

from __future__ import annotations

import typing
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict


class PluginParams(BaseModel):
    """Base of every plugin's ``Params``: strict (unknown keys are errors) and immutable.

    Subclasses declare ``kind: Literal["name"] = "name"`` and their own constrained, documented
    fields (``Field(..., description=...)`` or attribute docstrings).
    """

    model_config = ConfigDict(
        extra="forbid", frozen=True, use_attribute_docstrings=True, allow_inf_nan=False
    )

    kind: str


class Plugin:
    """Base of every plugin class: ``Params`` is its parameter model, ``params`` the values."""

    Params: ClassVar[type[PluginParams]]

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
