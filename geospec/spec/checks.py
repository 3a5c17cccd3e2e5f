"""Checks that span sections of a spec, as (dotted path, message) pairs a user can act on."""

from __future__ import annotations

from pydantic import BaseModel

from geospec.engine.model_size import attention_problems
from geospec.registry.loading import get_registries
from geospec.spec.resolve import measures, model_dims
from geospec.spec.sections import (
    DIAGNOSTIC_PROFILES,
    BPETokenizer,
    PretrainedTokenizer,
    Spec,
)


def cross_check(spec: Spec) -> list[tuple[str, str]]:
    """Problems that span sections, as (dotted path, message) pairs; empty when sound."""
    problems: list[tuple[str, str]] = []
    m = spec.model
    problems += [("model.n_heads", message) for message in attention_problems(m)]
    if m.ffn_width % m.multiple_of:
        problems.append(
            (
                "model.ffn_width",
                f"{m.ffn_width} is not a multiple of model.multiple_of "
                f"{m.multiple_of}, so the uniform arm cannot be rounded; use "
                f"{max(m.multiple_of, round(m.ffn_width / m.multiple_of) * m.multiple_of)} "
                "or change multiple_of",
            )
        )
    tok = spec.data.tokenizer
    if m.vocab_size is not None and isinstance(tok, BPETokenizer) and tok.vocab_size > m.vocab_size:
        problems.append(
            (
                "model.vocab_size",
                f"{m.vocab_size} is smaller than data.tokenizer.vocab_size "
                f"{tok.vocab_size}; remove model.vocab_size to take it from the tokenizer",
            )
        )
    seen: dict[str, int] = {}
    for i, arm in enumerate(spec.arms):
        if arm.name in seen:
            problems.append(
                (
                    f"arms[{i}].name",
                    f"duplicate arm name {arm.name!r} (also arms[{seen[arm.name]}])",
                )
            )
        seen.setdefault(arm.name, i)
    profile_names: dict[str, int] = {}
    for i, entry in enumerate(measures(spec)):
        if entry.profile in profile_names:
            problems.append(
                (f"measure[{i}]", f"profile {entry.profile!r} is measured twice; give one a name")
            )
        profile_names.setdefault(entry.profile, i)
    if spec.diagnose.enabled:
        problems += [
            (f"measure[{i}].name", f"{name!r} is a diagnostic profile's name; choose another")
            for name, i in profile_names.items()
            if name in DIAGNOSTIC_PROFILES
        ]
    registries = get_registries()
    dims = model_dims(spec.model)
    for i, arm in enumerate(spec.arms):
        schedule = registries.create("schedule", arm.schedule)
        for profile in schedule.required_profiles():
            if profile in DIAGNOSTIC_PROFILES and spec.diagnose.enabled:
                continue
            if profile in DIAGNOSTIC_PROFILES:
                problems.append(
                    (
                        f"arms[{i}].schedule.{_field_naming(arm.schedule, profile)}",
                        f"{profile!r} is computed by the diagnose stage; set "
                        "[diagnose] enabled = true to use it",
                    )
                )
            elif profile not in profile_names:
                available = ", ".join(repr(p) for p in profile_names) or "none"
                problems.append(
                    (
                        f"arms[{i}].schedule.profile",
                        f"{profile!r} is not measured; measured "
                        f'profiles: {available}. Add it to [[measure]] or use measure = "all"',
                    )
                )
        problems += [(f"arms[{i}].schedule", message) for message in schedule.check(dims)]
    if spec.reference.checkpoint is not None and not isinstance(tok, PretrainedTokenizer):
        problems.append(
            (
                "data.tokenizer",
                "a pretrained reference.checkpoint reads tokens of its own "
                f'tokenizer; set tokenizer = {{ kind = "pretrained", path = '
                f'"{spec.reference.checkpoint}" }}',
            )
        )
    if len(spec.arms) > 1 and spec.report.baseline not in seen:
        problems.append(
            (
                "report.baseline",
                f"no arm is named {spec.report.baseline!r}; add that arm "
                '(schedule = { kind = "uniform" }) or set report.baseline to one of '
                + ", ".join(repr(a.name) for a in spec.arms),
            )
        )
    return problems


def _field_naming(schedule: BaseModel, profile: str) -> str:
    """The schedule parameter that names ``profile`` (for the error's dotted path)."""
    params = schedule.model_dump()
    return next((key for key, value in params.items() if value == profile), "profile")
