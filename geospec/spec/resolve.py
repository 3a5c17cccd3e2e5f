"""What a spec resolves to beyond its own fields: the measures in effect (``measure = "all"``
expanded), the target model's dimensions and shape, and the vocabulary size when it is known
without loading a tokenizer."""

from __future__ import annotations

from typing import Any

from geospec.kinds import ModelDims
from geospec.shapes.model_size import Shape
from geospec.spec.sections import (
    BPETokenizer,
    GPT2Tokenizer,
    MeasureSpec,
    ModelSpec,
    PruneSpec,
    Spec,
)


def measures(spec: Spec) -> list[MeasureSpec]:
    """The measure entries in effect. ``"all"`` (the default) expands to the registered pairs,
    with defaults, that the spec needs (:func:`all_limited_to`): every one in a spec that solves
    [[arms]]; in a spec that only prunes, those some [prune] arm reads (none for uniform or
    flap arms)."""
    if spec.measure is not None:
        return list(spec.measure)
    limit = all_limited_to(spec)
    return [entry for entry in registered_measures() if limit is None or entry.profile in limit]


def registered_measures() -> list[MeasureSpec]:
    """Every registered geometry x statistic pair, with default parameters."""
    from geospec.registry.loading import get_registries

    return [
        MeasureSpec.model_validate({"geometry": geometry, "statistic": statistic})
        for statistic, geometry in get_registries().all_measures()
    ]


def prunes_only(spec: Spec) -> bool:
    """Whether the spec prunes a checkpoint and has no [[arms]] (nothing is trained or solved):
    its [prune] arms are the only readers of the measured profiles. (Such a spec is probe_only
    too: ``Spec`` sets it.)"""
    return spec.prune is not None and not spec.arms


def all_limited_to(spec: Spec) -> set[str] | None:
    """The profiles ``measure = "all"`` is limited to for ``spec``: in a spec that only prunes,
    those its [prune] arms read (no other stage or output reads a measured profile there); None
    (every registered pair) in any other, whose report shows every profile beside the widths."""
    if not prunes_only(spec):
        return None
    assert spec.prune is not None
    return set(prune_profiles(spec.prune))


def prune_profiles(prune: PruneSpec) -> list[str]:
    """The profiles the ``[prune]`` arms' schedules read (sorted; score allocations read none)."""
    from geospec.kinds import reads_scores
    from geospec.plugin import create_plugin

    names: set[str] = set()
    for arm in prune.arms:
        schedule = create_plugin("schedule", arm.schedule)
        if not reads_scores(schedule):
            names.update(schedule.required_profiles())
    return sorted(names)


def probes(spec: Spec) -> bool:
    """Whether the probe stage applies: a later stage reads its clouds (the measure stage's
    entries in effect, the diagnose stage). The demand stage reads only the probe's settings
    and its key, which it has without the clouds (:func:`geospec.pipeline.stages.probe.clouds_key`).
    A spec that measures nothing with [diagnose] off (a prune of uniform and flap arms, a study
    with measure = []) probes nothing."""
    return bool(measures(spec)) or spec.diagnose.enabled


def model_dims(model: ModelSpec) -> ModelDims:
    """What schedules and solvers know of the target model."""
    return ModelDims(
        model.n_layers, model.d_model, model.ffn_width, model.multiple_of, model.activation
    )


GPT2_VOCAB_SIZE = 50257


def declared_vocab_size(spec: Spec) -> int | None:
    """The vocabulary size known without loading the tokenizer (None for a pretrained directory)."""
    if spec.model.vocab_size is not None:
        return spec.model.vocab_size
    tokenizer = spec.data.tokenizer
    if isinstance(tokenizer, BPETokenizer):
        return tokenizer.vocab_size
    if isinstance(tokenizer, GPT2Tokenizer):
        return GPT2_VOCAB_SIZE
    return None


def model_shape(spec: Spec, vocab_size: int) -> Shape:
    return Shape.of(spec.model, vocab_size=vocab_size)


def resolved_spec(spec: Spec) -> dict[str, Any]:
    """The spec as it runs, in JSON form: every default filled in, every plugin table with all
    its parameters, and the measures in effect (``measure = "all"`` expanded). What
    ``spec.resolved.toml`` records and ``geospec validate --json`` prints."""
    resolved: dict[str, Any] = spec.model_dump(mode="json")
    resolved["measure"] = [entry.key_form() for entry in measures(spec)]
    return resolved
