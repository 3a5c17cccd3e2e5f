"""What every plugin is: a class with a pydantic ``Params`` model whose literal ``kind`` names it.

A spec names a plugin by a table, ``geometry = { kind = "hyperbolic", radius = 0.9 }``; validation
finds the class registered under ``kind`` and validates the table with its ``Params``. The
instance the pipeline uses is ``cls(params)``.

With :mod:`geospec.kinds` (the contracts) this is the public API of plugin authors: the base
classes, the ``Register`` callback type, and the fields a plugin uses to hold another plugin's
table (``SmootherRef``, ``SolverRef``, ...), validated through the registry in effect.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    TypeAdapter,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import PydanticCustomError, core_schema

#: The callback every ``geospec_register_*`` hook receives: call it with each plugin class.
Register = Callable[[type[Any]], None]


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


class PluginTable:
    """Validates a spec field holding a plugin table through the registry in effect."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.with_info_plain_validator_function(
            self._validate,
            serialization=core_schema.plain_serializer_function_ser_schema(
                lambda params: params.model_dump(mode="json")
            ),
        )

    def _validate(self, value: Any, info: core_schema.ValidationInfo) -> PluginParams:
        from geospec.errors import PluginError
        from geospec.registry.loading import get_registries

        try:
            return get_registries().params(self.kind, value, context=info.context)
        except PluginTableError as error:
            raise PydanticCustomError("plugin_table", str(error)) from None
        except PluginError as error:
            raise PydanticCustomError("unknown_plugin", str(error)) from None

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        from geospec.registry.loading import get_registries

        classes = [entry.cls.Params for entry in get_registries()[self.kind].entries.values()]
        if not classes:
            return {"type": "object", "description": f"no {self.kind} plugins are registered"}
        if len(classes) == 1:
            return handler(TypeAdapter(classes[0]).core_schema)
        # a variable, not a type alias: the union is built from what is registered at run time
        union: Any = Annotated[Union[tuple(classes)], Field(discriminator="kind")]  # noqa: UP007
        return handler(TypeAdapter(union).core_schema)


if TYPE_CHECKING:
    GeometryRef = PluginParams
    StatisticRef = PluginParams
    SmootherRef = PluginParams
    SolverRef = PluginParams
    ScheduleRef = PluginParams
    LauncherRef = PluginParams
    TrackerRef = PluginParams
    ImportanceRef = PluginParams
else:
    GeometryRef = Annotated[PluginParams, PluginTable("geometry")]
    StatisticRef = Annotated[PluginParams, PluginTable("statistic")]
    SmootherRef = Annotated[PluginParams, PluginTable("smoother")]
    SolverRef = Annotated[PluginParams, PluginTable("solver")]
    ScheduleRef = Annotated[PluginParams, PluginTable("schedule")]
    LauncherRef = Annotated[PluginParams, PluginTable("launcher")]
    TrackerRef = Annotated[PluginParams, PluginTable("tracker")]
    ImportanceRef = Annotated[PluginParams, PluginTable("importance")]


def create_plugin(kind: str, table: Any) -> Any:
    """The instance of the plugin of ``kind`` that ``table`` names, from the registries in effect
    (a schedule holding a smoother table creates its smoother with this)."""
    from geospec.registry.loading import get_registries

    return get_registries().create(kind, table)
