"""Checks that span sections of a spec, as (dotted path, message) pairs a user can act on."""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence

from pydantic import BaseModel

from geospec.kinds import reads_scores
from geospec.registry.loading import get_registries
from geospec.shapes.model_size import attention_problems, kv_head_problems
from geospec.shapes.pruned import keep_problem, pruned_dims
from geospec.spec.resolve import measures, model_dims
from geospec.spec.sections import (
    DIAGNOSTIC_PROFILES,
    BPETokenizer,
    PretrainedTokenizer,
    Spec,
    demand_profile_names,
)


def _demand_problems(spec: Spec) -> list[tuple[str, str]]:
    """Keep fractions that round below one multiple of the uniform width."""
    width, multiple = spec.model.ffn_width, spec.model.multiple_of
    problems = []
    for k, fraction in enumerate(spec.demand.keep):
        if round(fraction * width / multiple) * multiple < multiple:
            problems.append(
                (
                    f"demand.keep[{k}]",
                    f"{fraction:g} of model.ffn_width {width} rounds below one multiple "
                    f"(model.multiple_of {multiple}); use at least "
                    f"{multiple / width:.3g}, or lower multiple_of",
                )
            )
    return problems


def _prune_problems(spec: Spec, measured: set[str]) -> list[tuple[str, str]]:
    """[prune] needs a pretrained checkpoint, and its arms' profiles must be computed."""
    if spec.prune is None:
        return []
    problems = []
    for i, fraction in enumerate(spec.prune.fractions):
        problem = keep_problem(fraction, spec.model.ffn_width, spec.model.multiple_of)
        if problem is not None:
            where = f"prune.keep[{i}]" if isinstance(spec.prune.keep, list) else "prune.keep"
            problems.append((where, problem))
    if spec.reference.checkpoint is None:
        problems.append(
            (
                "prune",
                "prunes a pretrained reference.checkpoint (a Hugging Face directory, GGUF file "
                "or hub id); set [reference] checkpoint",
            )
        )
    available = set(measured)
    if spec.diagnose.enabled:
        available |= set(DIAGNOSTIC_PROFILES)
    if spec.demand.enabled:
        available |= set(demand_profile_names(spec.demand))
    registries = get_registries()
    m = spec.model
    # the model every arm is solved for at each sound keep fraction ([model] is the checkpoint's
    # shape in a pruning spec, its ffn_width the pretrained width): the prune stage's own
    budgets = {
        fraction: pruned_dims(
            m.n_layers, m.d_model, m.ffn_width, m.multiple_of, fraction, m.activation
        )
        for fraction in spec.prune.fractions
        if keep_problem(fraction, m.ffn_width, m.multiple_of) is None
    }
    names = {arm.name: i for i, arm in enumerate(spec.prune.arms)}
    sources: dict[str, list[str]] = {}
    for i, arm in enumerate(spec.prune.arms):
        schedule = registries.create("schedule", arm.schedule)
        # the arms it reads (fitted, sorted, evolve's start_arm): other prune arms
        read = schedule.required_arms()
        found = _source_arm_problems(i, arm.name, arm.schedule, read, names, spec.prune.sweeps)
        problems += [(f"prune.{path}", message) for path, message in found]
        sources[arm.name] = [source for source in read if source in names and source != arm.name]
        # a schedule's own problems at every pruned budget (protect's layers that no longer
        # fit, a solver's bounds), before the prune stage probes and scores anything
        said: set[str] = set()
        for fraction, dims in budgets.items():
            for message in schedule.check(dims):
                if message not in said:
                    said.add(message)
                    problems.append(
                        (f"prune.arms[{i}].schedule", f"at keep {fraction:g}: {message}")
                    )
        if reads_scores(schedule) or schedule.profiles_file() is not None:
            continue
        for profile in schedule.required_profiles():
            if profile not in available:
                problems.append(
                    (
                        f"prune.arms[{i}].schedule.{_field_naming(arm.schedule, profile)}",
                        f"{profile!r} is not computed by this spec; measure it ([[measure]]), or "
                        "enable [diagnose] or [demand] for their profiles",
                    )
                )
    loop = dependency_cycle(sources)
    if loop:
        first = names[loop[0]]
        schedule = spec.prune.arms[first].schedule
        problems.append(
            (
                f"prune.arms[{first}].schedule.{_field_naming(schedule, loop[1], 'of')}",
                "arms read each other's widths in a cycle ("
                + " -> ".join(repr(name) for name in loop)
                + "); start from an arm that is computed on its own",
            )
        )
    return problems


def cross_check(spec: Spec) -> list[tuple[str, str]]:
    """Problems that span sections, as (dotted path, message) pairs; empty when sound."""
    problems: list[tuple[str, str]] = []
    m = spec.model
    problems += [("model.n_heads", message) for message in attention_problems(m)]
    problems += [("model.n_kv_heads", message) for message in kv_head_problems(m)]
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
    if not spec.arms and not (spec.prune is not None and spec.probe_only):
        problems.append(
            (
                "arms",
                "lists no arm; add an [[arms]] table (only a spec that prunes a "
                "reference.checkpoint with [prune] and trains nothing may leave them out)",
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
    demand_profiles = demand_profile_names(spec.demand)
    if spec.demand.enabled:
        problems += [
            (f"measure[{i}].name", f"{name!r} is a demand profile's name; choose another")
            for name, i in profile_names.items()
            if name in demand_profiles
        ]
        problems += _demand_problems(spec)
    registries = get_registries()
    dims = model_dims(spec.model)
    sources: dict[str, list[str]] = {}
    for i, arm in enumerate(spec.arms):
        schedule = registries.create("schedule", arm.schedule)
        if reads_scores(schedule):
            problems.append(
                (
                    f"arms[{i}].schedule.kind",
                    f"{schedule.kind_name()!r} allocates from the neuron scores of a model being "
                    "pruned; list it under [prune] arms (geospec prune)",
                )
            )
            continue
        from_file = schedule.profiles_file() is not None  # read from it, not measured here
        for profile in [] if from_file else schedule.required_profiles():
            if profile in DIAGNOSTIC_PROFILES and spec.diagnose.enabled:
                continue
            if profile in demand_profiles and spec.demand.enabled:
                continue
            if profile.startswith("demand/"):
                fractions = ", ".join(repr(name) for name in demand_profiles)
                problems.append(
                    (
                        f"arms[{i}].schedule.{_field_naming(arm.schedule, profile)}",
                        f"{profile!r} is measured by the demand stage; set [demand] enabled = "
                        f"true (it writes {fractions})",
                    )
                )
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
                        f"arms[{i}].schedule.{_field_naming(arm.schedule, profile)}",
                        f"{profile!r} is not measured; measured "
                        f'profiles: {available}. Add it to [[measure]] or use measure = "all"',
                    )
                )
        problems += [(f"arms[{i}].schedule", message) for message in schedule.check(dims)]
        problems += _source_arm_problems(i, arm.name, arm.schedule, schedule.required_arms(), seen)
        sources[arm.name] = [s for s in schedule.required_arms() if s in seen and s != arm.name]
    loop = dependency_cycle(sources)
    if loop:
        first = next(i for i, arm in enumerate(spec.arms) if arm.name == loop[0])
        problems.append(
            (
                f"arms[{first}].schedule.{_field_naming(spec.arms[first].schedule, loop[1], 'of')}",
                "arms read each other's widths in a cycle ("
                + " -> ".join(repr(name) for name in loop)
                + "); derive each arm from one that is computed on its own",
            )
        )
    problems += _prune_problems(spec, set(profile_names))
    reference = spec.reference
    if reference.checkpoint is not None and not isinstance(tok, PretrainedTokenizer):
        revision = f', revision = "{reference.revision}"' if reference.revision else ""
        problems.append(
            (
                "data.tokenizer",
                "a pretrained reference.checkpoint reads tokens of its own "
                f'tokenizer; set tokenizer = {{ kind = "pretrained", path = '
                f'"{reference.checkpoint}"{revision} }}',
            )
        )
    if (
        isinstance(tok, PretrainedTokenizer)
        and tok.path == reference.checkpoint
        and tok.revision != reference.revision
    ):
        problems.append(
            (
                "data.tokenizer.revision",
                f"{tok.revision!r} differs from reference.revision {reference.revision!r} for the "
                f"same hub model {tok.path}; the probe must feed the model its own tokens",
            )
        )
    if spec.data.val_fraction >= 0.5 and not (spec.probe_only and spec.reference.checkpoint):
        problems.append(
            (
                "data.val_fraction",
                f"{spec.data.val_fraction} leaves too little text to train on; use less than 0.5 "
                "(up to 1.0 only for a probe_only spec with a reference.checkpoint, which trains "
                "nothing)",
            )
        )
    if spec.data.val_fraction >= 1.0 and spec.probe.calibration_split == "train":
        problems.append(
            (
                "data.val_fraction",
                "1.0 leaves no training text, and a prune calibrates on the training split "
                "(probe.calibration_split, prune.calibration); use less than 1.0",
            )
        )
    selects = spec.prune is not None and spec.prune.select is not None
    if selects and spec.prune is not None and len(spec.prune.arms) < 2:
        problems.append(
            (
                "prune.select",
                f"a recommendation chooses among arms, and there is one "
                f"({spec.prune.arms[0].name}); add another arm or remove select",
            )
        )
    if selects and spec.probe.calibration_split != "train":
        problems.append(
            (
                "prune.select",
                "chooses on [data]'s validation split, which the probe, diagnose and demand "
                'read here (probe.calibration_split = "val"); set it to "train"',
            )
        )
    if spec.eval is not None:
        problems += [("eval", message) for message in eval_problems(spec)]
    if len(spec.arms) > 1 and spec.report.baseline not in seen:
        problems.append(
            (
                "report.baseline",
                f"no arm is named {spec.report.baseline!r}; add that arm "
                '(schedule = { kind = "uniform" }) or set report.baseline to one of '
                + ", ".join(repr(a.name) for a in spec.arms),
            )
        )
    problems += _compare_problems(spec, seen)
    return problems


def _compare_problems(spec: Spec, arms: dict[str, int]) -> list[tuple[str, str]]:
    """Each report.compare pair names two different arms of the spec (trained, or of [prune]),
    once."""
    problems: list[tuple[str, str]] = []
    pairs: dict[frozenset[str], int] = {}
    pruned = [arm.name for arm in spec.prune.arms] if spec.prune is not None else []
    names = [a.name for a in spec.arms] + [name for name in pruned if name not in arms]
    for i, (arm, against) in enumerate(spec.report.compare):
        where = f"report.compare[{i}]"
        unknown = [name for name in (arm, against) if name not in arms and name not in pruned]
        if unknown:
            problems.append(
                (
                    where,
                    f"no arm is named {unknown[0]!r}; the arms are "
                    + ", ".join(repr(name) for name in names),
                )
            )
        elif arm == against:
            problems.append((where, f"compares {arm!r} with itself; name two different arms"))
        elif frozenset((arm, against)) in pairs:
            problems.append(
                (
                    where,
                    f"{arm!r} and {against!r} are compared already in report.compare"
                    f"[{pairs[frozenset((arm, against))]}]; remove one of the two",
                )
            )
        pairs.setdefault(frozenset((arm, against)), i)
    return problems


def eval_problems(spec: Spec) -> list[str]:
    """Why the arms of ``spec`` cannot be evaluated: nothing is trained and no pruned model is
    exported, or the model has no transformers equivalent to export it as (the two families of
    geospec.engine.export). A prune's models are its checkpoint's family: exported as they are."""
    if spec.probe_only and spec.prune is not None:
        if spec.prune.export is False:
            return [
                "[prune] export = false writes no pruned model to evaluate; set prune.export = "
                'true (or list the units to evaluate: export = ["flap@0.5", "uniform@0.5"])'
            ]
        return []
    if spec.probe_only:
        return ["a probe_only spec trains no arm to evaluate; remove [eval] or probe_only"]
    m = spec.model
    gpt2 = (m.positions, m.norm, m.activation) == ("learned", "layernorm", "gelu")
    llama = (m.positions, m.norm, m.activation) == ("rope", "rmsnorm", "swiglu")
    if (gpt2 and m.n_kv_heads in (None, m.n_heads)) or llama:
        return []
    return [
        f"a model with {m.positions} positions, {m.norm} and {m.activation} cannot be exported "
        "for lm-eval: geospec exports learned/layernorm/gelu (GPT-2) and rope/rmsnorm/swiglu "
        "(Llama) models"
    ]


def _source_arm_problems(
    i: int,
    name: str,
    schedule: BaseModel,
    sources: list[str],
    arms: dict[str, int],
    grids: Mapping[str, list[str]] | None = None,
) -> list[tuple[str, str]]:
    """The arms an arm's schedule reads (``fitted``, ``sorted``, ``evolve``'s ``start_arm``)
    must be other arms of the spec; a prune grid's name (``grids``: its expanded arms) is not
    one."""
    problems = []
    for source in sources:
        path = f"arms[{i}].schedule.{_field_naming(schedule, source, 'of')}"
        if source == name:
            problems.append((path, f"arm {name!r} cannot be derived from itself; name another arm"))
        elif grids and source in grids and source not in arms:
            problems.append(
                (
                    path,
                    f"{source!r} is a grid, whose best setting is chosen after every arm's widths; "
                    "name one of its settings: " + ", ".join(repr(arm) for arm in grids[source]),
                )
            )
        elif source not in arms:
            close = difflib.get_close_matches(source, list(arms), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            problems.append(
                (
                    path,
                    f"no arm is named {source!r}; {hint}arms: "
                    + ", ".join(repr(arm) for arm in arms),
                )
            )
    return problems


def _field_naming(schedule: BaseModel, value: str, default: str = "profile") -> str:
    """The schedule parameter that holds ``value`` (for the error's dotted path), looking inside
    nested tables too (``around.profile`` of a protect schedule)."""
    return _holding(schedule.model_dump(), value) or default


def _holding(params: dict[str, object], value: str) -> str | None:
    """The dotted key of ``params`` whose value is ``value``, or None (never ``kind``: an arm
    may be named as its schedule is, ``start_arm = "evolve"`` in an arm of kind evolve)."""
    for key, held in params.items():
        if held == value and key != "kind":
            return key
        if isinstance(held, dict):
            inner = _holding(held, value)
            if inner is not None:
                return f"{key}.{inner}"
    return None


def dependency_cycle(sources: Mapping[str, Sequence[str]]) -> list[str] | None:
    """A cycle among the arms, as the path ``[a, b, ..., a]``, or None (sources not among the
    arms are ignored: they are reported on their own)."""
    state: dict[str, str] = {}  # "open" while on the current path, "done" once explored

    def visit(name: str, path: list[str]) -> list[str] | None:
        state[name] = "open"
        for source in sources.get(name, ()):
            if state.get(source) == "open":  # on the current path: the path closes a cycle
                return [*path[path.index(source) :], source]
            if source in sources and source not in state:
                found = visit(source, [*path, source])
                if found:
                    return found
        state[name] = "done"
        return None

    for name in sources:
        if name not in state:
            found = visit(name, [name])
            if found:
                return found
    return None
