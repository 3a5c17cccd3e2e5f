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
    """The measure entries in effect: ``"all"`` expands to every registered pair with defaults."""
    if spec.measure is not None:
        return list(spec.measure)
    from geospec.registry.loading import get_registries

    return [
        MeasureSpec.model_validate({"geometry": geometry, "statistic": statistic})
        for statistic, geometry in get_registries().all_measures()
    ]


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
