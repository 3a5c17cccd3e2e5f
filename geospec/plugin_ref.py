"""A spec field that holds a plugin table, validated through the registry at validation time.

``geometry: PluginRef["geometry"]`` accepts ``{ kind = "hyperbolic", radius = 0.9 }`` (or the bare
string ``"hyperbolic"``), looks ``kind`` up in the geometry registry in effect and validates the
rest with that plugin's ``Params``. Plugins may use these fields too (a schedule holding a
smoother).
The JSON schema lists the registered plugins' parameter models as a discriminated union.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Union

from pydantic import Field, GetCoreSchemaHandler, GetJsonSchemaHandler, TypeAdapter
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import PydanticCustomError, core_schema

from geospec.plugin import PluginParams


class PluginTable:
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
        from geospec.plugins import get_registries

        if isinstance(value, PluginParams):
            value = value.model_dump()
        if isinstance(value, str):
            value = {"kind": value}
        if not isinstance(value, dict):
            raise PydanticCustomError(
                "plugin_table",
                f'must be a {self.kind} table such as {{ kind = "..." }}, '
                f"not {type(value).__name__}",
            )
        kind = value.get("kind")
        if not isinstance(kind, str):
            raise PydanticCustomError(
                "plugin_kind_missing",
                f"a {self.kind} table needs a 'kind' key naming the {self.kind}",
            )
        registry = get_registries()[self.kind]
        if kind not in registry:
            raise PydanticCustomError("unknown_plugin", registry.unknown_message(kind))
        params_cls = registry.get(kind).cls.Params
        return params_cls.model_validate(value, context=info.context)

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        from geospec.plugins import get_registries

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
else:
    GeometryRef = Annotated[PluginParams, PluginTable("geometry")]
    StatisticRef = Annotated[PluginParams, PluginTable("statistic")]
    SmootherRef = Annotated[PluginParams, PluginTable("smoother")]
    SolverRef = Annotated[PluginParams, PluginTable("solver")]
    ScheduleRef = Annotated[PluginParams, PluginTable("schedule")]
