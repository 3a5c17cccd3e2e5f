"""The public API of plugin authors, with :mod:`geospec.kinds` (the contracts): the base classes
and the ``Register`` callback type (from :mod:`geospec.plugin_base`), and the fields a plugin uses
to hold another plugin's table (``SmootherRef``, ``SolverRef``, ...) with :func:`create_plugin`,
validated and created through the registry in effect.

The base lives below the registry and this module above it, so that neither imports the other
from inside a function (docs/architecture.md, "Rules").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Union

from pydantic import Field, GetCoreSchemaHandler, GetJsonSchemaHandler, TypeAdapter
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import PydanticCustomError, core_schema

from geospec.errors import PluginError
from geospec.plugin_base import (
    ADDED_LATER,
    AddedLater,
    Plugin,
    PluginParams,
    PluginTableError,
    Register,
    as_table,
    kind_of,
)
from geospec.registry.loading import get_registries

__all__ = [
    "ADDED_LATER",
    "AddedLater",
    "GeometryRef",
    "ImportanceRef",
    "LauncherRef",
    "Plugin",
    "PluginParams",
    "PluginTable",
    "PluginTableError",
    "Register",
    "ScheduleRef",
    "SmootherRef",
    "SolverRef",
    "StatisticRef",
    "TrackerRef",
    "as_table",
    "create_plugin",
    "kind_of",
]


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
        try:
            return get_registries().params(self.kind, value, context=info.context)
        except PluginTableError as error:
            raise PydanticCustomError("plugin_table", str(error)) from None
        except PluginError as error:
            raise PydanticCustomError("unknown_plugin", str(error)) from None

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        if self.kind in _SCHEMAS_IN_PROGRESS:
            # A plugin table inside a plugin of its own kind (protect's around, a schedule in a
            # schedule) would expand forever: name the kind instead of expanding it again.
            return {
                "type": "object",
                "required": ["kind"],
                "description": f"a {self.kind} table: any {self.kind} plugin, as above",
            }
        entries = get_registries()[self.kind].entries
        classes = [entry.cls.Params for entry in entries.values()]
        if not classes:
            return {"type": "object", "description": f"no {self.kind} plugins are registered"}
        _SCHEMAS_IN_PROGRESS.add(self.kind)
        try:
            if len(classes) == 1:
                table = handler(TypeAdapter(classes[0]).core_schema)
            else:
                # a variable, not a type alias: the union is built from what is registered now
                union: Any = Annotated[Union[tuple(classes)], Field(discriminator="kind")]  # noqa: UP007
                table = handler(TypeAdapter(union).core_schema)
        finally:
            _SCHEMAS_IN_PROGRESS.discard(self.kind)
        # as_table also takes a plugin named by its kind alone (`geometry = "spherical"`), where
        # its params all have defaults
        named = sorted(
            name
            for name, entry in entries.items()
            if not any(
                field.is_required()
                for key, field in entry.cls.Params.model_fields.items()
                if key != "kind"
            )
        )
        if not named:
            return table
        by_name = {"type": "string", "enum": named, "description": f"a {self.kind} by its kind"}
        return {"anyOf": [by_name, table]}


#: The plugin kinds whose JSON schema is being generated (the outer ones of a nested table).
_SCHEMAS_IN_PROGRESS: set[str] = set()


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
    return get_registries().create(kind, table)
