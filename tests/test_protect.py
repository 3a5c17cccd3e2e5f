"""The protect schedule (the first and last layers at full width, the rest uniform or as another
schedule allocates them) on hand-worked cases, at every keep fraction where it fits, and its bad
input."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from geospec.cli import cli
from geospec.errors import SpecError, UsageError
from geospec.kinds import ModelDims, Schedule
from geospec.plugin import create_plugin
from geospec.prune.allocate import allocate
from geospec.shapes.pruned import pruned_dims
from geospec.solve.widths import compute_widths
from geospec.spec.loading import validate_spec
from geospec.spec.sections import ArmSpec
from geospec.testing import minimal_spec


def schedule(**params: Any) -> Schedule:
    made: Schedule = create_plugin("schedule", {"kind": "protect", **params})
    return made


#: SmolLM2's pretrained width, 6 layers, pruned to half in multiples of 64: uniform 768, budget
#: 6 x 768 = 4608.
HALF = pruned_dims(6, 64, 1536, 64, 0.5, "swiglu")


def test_first_and_last_whole_the_rest_uniform() -> None:
    """Layers 0 and 5 keep 1536 each (3072); the other four share 4608 - 3072 = 1536: 384 each."""
    assert HALF.budget == 4608
    widths = schedule(first=1, last=1).widths(HALF, {})
    assert widths == [1536, 384, 384, 384, 384, 1536]


def test_the_default_protects_the_first_layer_and_rounds_the_rest_exactly() -> None:
    """first = 1, last = 0: the other five share 4608 - 1536 = 3072 = 48 multiples of 64, 9.6
    each: 9 each (45) and the 3 left over to the first three of them (equal remainders go in
    layer order): 640 640 640 576 576."""
    widths = schedule().widths(HALF, {})
    assert widths == [1536, 640, 640, 640, 576, 576]
    assert sum(widths) == HALF.budget


def test_a_remainder_that_is_no_whole_multiple_per_layer() -> None:
    """Uniform 704 (budget 4224): the four middle layers share 4224 - 3072 = 1152 = 18
    multiples, 4.5 each: 4 each and 2 left over: 320 320 256 256."""
    dims = ModelDims(6, 64, 704, 64, max_width=1536)
    assert schedule(first=1, last=1).widths(dims, {}) == [1536, 320, 320, 256, 256, 1536]


def test_a_training_arm_protects_at_the_width_it_is_given() -> None:
    """No pretrained width: width = 128 for layer 0 of 4 layers of 64 (budget 256); the other
    three share 128, 16 multiples of 8, 5.33 each: 5 each and the one left to the first of them:
    48 40 40."""
    dims = ModelDims(4, 32, 64, 8)
    assert schedule(width=128).widths(dims, {}) == [128, 48, 40, 40]


GEOMETRIC = {"kind": "geometric", "profile": "p"}


def test_protecting_no_layer_is_the_inner_schedule_and_needs_no_width() -> None:
    dims = ModelDims(4, 32, 64, 8)  # a training model: no pretrained width
    assert schedule(first=0).check(dims) == []
    assert schedule(first=0).widths(dims, {}) == [64] * 4
    cosine = {"kind": "cosine"}
    alone = create_plugin("schedule", cosine).widths(dims, {})
    assert schedule(first=0, around=cosine).widths(dims, {}) == alone


def test_around_a_geometric_schedule_the_middle_is_that_schedule_on_the_middle() -> None:
    """The middle layers 1-4 of profile 6 5 4 3 2 1 have work 5 4 3 2 and share 1152 (uniform
    288; power_law's bounds 0.25x and 2x, 128 and 576 in multiples, bind nowhere). With a = 1,
    w ~ sqrt(work): 349.0 312.2 270.4 220.8, floors 5 4 4 3 multiples (16 of 18) and the two
    left to the largest remainders, layer 2 (.88) and then the tie .45 of layers 1 and 4 to the
    one with more work: 384 320 256 192."""
    dims = ModelDims(6, 64, 704, 64, max_width=1536)
    profile = [6.0, 5.0, 4.0, 3.0, 2.0, 1.0]
    protect = schedule(first=1, last=1, around=GEOMETRIC)
    assert protect.required_profiles() == ["p"]
    widths = protect.widths(dims, {"p": profile})
    assert widths == [1536, 384, 320, 256, 192, 1536]
    alone = create_plugin("schedule", GEOMETRIC)
    middle = ModelDims(4, 64, 288, 64, max_width=1536)  # 1152 over 4 layers, as a model
    assert widths[1:-1] == alone.widths(middle, {"p": profile[1:-1]})


def test_around_on_a_remainder_that_is_no_whole_width_per_layer() -> None:
    """The middle of 5 layers shares 4608 - 1536 = 3072, 614.4 a layer: the inner schedule gets
    that budget exactly (a uniform inner schedule gives what protect alone gives)."""
    profile = [1.0] * 6
    around = schedule(around=GEOMETRIC).widths(HALF, {"p": profile})
    assert around == schedule().widths(HALF, {}) == [1536, 640, 640, 640, 576, 576]


def test_profiles_of_another_depth_are_resampled_to_the_model_then_cut() -> None:
    """A 3-layer profile 3 2 1 read by a 5-layer model is 3 2.5 2 1.5 1; its middle 2.5 2 1.5."""
    dims = ModelDims(5, 64, 512, 64, max_width=1024)  # budget 2560, the middle shares 512
    widths = schedule(first=1, last=1, around=GEOMETRIC).widths(dims, {"p": [3.0, 2.0, 1.0]})
    alone = create_plugin("schedule", GEOMETRIC)
    middle = ModelDims(3, 64, 0, 64, max_width=1024, total_width=512)
    assert widths[1:-1] == alone.widths(middle, {"p": [2.5, 2.0, 1.5]})
    assert widths[0] == widths[-1] == 1024 and sum(widths) == 2560


def test_bounds_are_the_inner_schedules_widened_to_the_full_width() -> None:
    dims = ModelDims(6, 64, 704, 64, max_width=1536)
    assert schedule(first=1, last=1).bounds(dims) is None
    # power_law 0.25x and 2x of the middle's 288: 72 and 576, inward to multiples: 128, 576
    assert schedule(first=1, last=1, around=GEOMETRIC).bounds(dims) == (128, 1536)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(2, 40),
    st.sampled_from([64, 128]),
    st.integers(4, 40),
    st.floats(0.02, 1.0),
    st.integers(0, 6),
    st.integers(0, 6),
)
def test_valid_at_every_keep_fraction_where_the_protected_layers_fit(
    n: int, multiple: int, units: int, keep: float, first: int, last: int
) -> None:
    width = units * multiple
    if round(keep * width / multiple) < 1:
        return  # no pruning at this keep at all (prune.keep says so)
    dims = pruned_dims(n, 64, width, multiple, keep, "swiglu")
    protect = schedule(first=first, last=last)
    protected, middle = first + last, n - first - last
    fits = middle >= 1 and dims.budget - protected * width >= middle * multiple
    if not fits:
        assert protect.check(dims)
        with pytest.raises(UsageError, match=r"^protect: "):
            protect.widths(dims, {})
        return
    assert protect.check(dims) == []
    widths = protect.widths(dims, {})
    assert len(widths) == n and sum(widths) == dims.budget
    assert widths[:first] == [width] * first and widths[n - last :] == [width] * last
    rest = widths[first : n - last]
    assert all(w % multiple == 0 and multiple <= w <= width for w in rest)
    assert max(rest) - min(rest) <= multiple  # uniform to one multiple


@pytest.mark.parametrize(
    ("params", "dims", "fragment"),
    [
        ({"first": 3, "last": 3}, HALF, "first + last = 3 + 3 protects all the model's 6 layers"),
        ({"first": 5, "last": 2}, HALF, "protects more than the model's 6 layers"),
        (
            {"first": 2, "last": 1},
            pruned_dims(6, 64, 1536, 64, 0.25, "swiglu"),  # budget 2304 < 3 x 1536
            "the protected 3 layers at width 1536 take 4608 of the budget 2304; the other 3 "
            "need at least one multiple (64) each, 192 in all; keep more or protect fewer layers",
        ),
        ({}, ModelDims(4, 32, 64, 8), "width is not set, and a training arm has no pretrained"),
        ({"width": 100}, ModelDims(4, 32, 64, 8), "width 100 is not a positive multiple of"),
        ({"width": 2048}, HALF, "width 2048 exceeds the pretrained width 1536"),
        ({"around": "flap"}, HALF, "around: 'flap' allocates from neuron scores"),
        ({"around": {"kind": "sorted", "of": "x"}}, HALF, "around: 'sorted' reads the widths"),
    ],
)
def test_bad_input_is_one_line_naming_the_field(
    params: dict[str, Any], dims: ModelDims, fragment: str
) -> None:
    protect = schedule(**params)
    (problem,) = protect.check(dims)
    assert fragment in problem
    with pytest.raises(UsageError) as error:
        protect.widths(dims, {})
    assert fragment in str(error.value) and "\n" not in str(error.value)


def test_the_inner_schedules_problems_name_it() -> None:
    """8 layers sharing 640 in multiples of 64, the first two and last two at 64: the middle
    four share 384, 96 each, and power_law's min_ratio 0.9 (86.4, up to 128 a layer: 512 in all)
    cannot meet it; the solver's own message (min_ratio <= 2/3) comes prefixed with around."""
    dims = ModelDims(8, 32, 80, 64)
    solver = {"kind": "power_law", "min_ratio": 0.9}
    around = {"kind": "geometric", "profile": "p", "solver": solver}
    (problem,) = schedule(first=2, last=2, width=64, around=around).check(dims)
    assert problem.startswith("around: ") and "min_ratio <= 0.666667" in problem


def test_a_training_spec_refuses_protect_without_width_at_validate() -> None:
    arms = [
        {"name": "uniform", "schedule": {"kind": "uniform"}},
        {"name": "protect", "schedule": {"kind": "protect"}},
    ]
    with pytest.raises(SpecError) as error:
        validate_spec(minimal_spec(arms=arms))
    message = str(error.value)
    assert "arms[1].schedule" in message and "set width" in message


@pytest.mark.parametrize(("field", "value"), [("first", -1), ("last", -2)])
def test_negative_counts_are_refused_naming_the_field(field: str, value: int) -> None:
    arms = [
        {"name": "uniform", "schedule": {"kind": "uniform"}},
        {"name": "protect", "schedule": {"kind": "protect", "width": 128, field: value}},
    ]
    with pytest.raises(SpecError) as error:
        validate_spec(minimal_spec(arms=arms))
    assert f"arms[1].schedule.{field}" in str(error.value)


def test_a_training_arm_with_width_keeps_the_budget_and_its_profile_is_checked() -> None:
    """4 layers of 64 in multiples of 8: width 96 for layers 0 and 3 leaves 64 for 1 and 2."""
    arms = [
        {"name": "uniform", "schedule": {"kind": "uniform"}},
        {"name": "ends", "schedule": {"kind": "protect", "first": 1, "last": 1, "width": 96}},
    ]
    spec = validate_spec(minimal_spec(arms=arms))
    result = compute_widths(spec.model, spec.arms)
    assert result.widths["ends"] == [96, 32, 32, 96]
    assert result.ffn_params["ends"] == result.ffn_params["uniform"]
    missing = [
        *arms[:1],
        {"name": "g", "schedule": {"kind": "protect", "width": 96, "around": GEOMETRIC}},
    ]
    with pytest.raises(SpecError) as error:
        validate_spec(minimal_spec(arms=missing))
    assert "arms[1].schedule.around.profile" in str(error.value)


def test_a_prune_arm_allocates_and_refuses_a_budget_too_small() -> None:
    arms = [
        ArmSpec.model_validate({"name": "uniform", "schedule": {"kind": "uniform"}}),
        ArmSpec.model_validate({"name": "ends", "schedule": {"kind": "protect", "last": 1}}),
    ]
    widths = allocate(arms, HALF, {}, [[1.0] * 1536] * 6)
    assert widths == {"uniform": [768] * 6, "ends": [1536, 384, 384, 384, 384, 1536]}
    tenth = pruned_dims(6, 64, 1536, 64, 0.1, "swiglu")  # uniform 128: budget 768 < 2 x 1536
    with pytest.raises(UsageError, match=r"^prune arm 'ends': protect: the protected 2 layers"):
        allocate(arms, tenth, {}, [[1.0] * 1536] * 6)


def prune_spec(keep: list[float], *arms: dict[str, Any]) -> dict[str, Any]:
    """A pruning spec of the minimal model (4 layers of 64, multiples of 8) as its checkpoint."""
    return minimal_spec(
        probe_only=True,
        reference={"checkpoint": "model"},
        data={"tokenizer": {"kind": "pretrained", "path": "model"}},
        prune={"keep": keep, "arms": [{"name": "uniform", "schedule": "uniform"}, *arms]},
    )


def test_validate_checks_a_prune_arm_at_every_keep_fraction() -> None:
    """At keep 1/2 (uniform 32, budget 128) layer 0 at 64 leaves 64 for three layers: fits. At
    keep 1/8 (uniform 8, budget 32) it takes 64 of 32: the arm is refused before any probing."""
    protect = {"name": "protect", "schedule": {"kind": "protect"}}
    validate_spec(prune_spec([0.5], protect))
    with pytest.raises(SpecError) as error:
        validate_spec(prune_spec([0.5, 0.125], protect))
    (line,) = [line for line in str(error.value).splitlines() if "prune.arms" in line]
    assert (
        "prune.arms[1].schedule: at keep 0.125: the protected layer at width 64 takes 64 of the "
        "budget 32; the other 3 need at least one multiple (8) each, 24 in all; keep more or "
        "protect fewer layers"
    ) in line
    assert "keep 0.5" not in line


def test_validate_refuses_a_keep_fraction_below_one_multiple() -> None:
    with pytest.raises(SpecError, match=r"prune\.keep\[1\]: 0\.05 of 64 neurons rounds below"):
        validate_spec(prune_spec([0.5, 0.05]))


def test_geospec_validate_exits_2_with_one_line_for_a_bad_protect_arm(tmp_path: Path) -> None:
    import tomlkit

    arms = [
        {"name": "uniform", "schedule": {"kind": "uniform"}},
        {"name": "ends", "schedule": {"kind": "protect", "first": 2, "last": 2, "width": 64}},
    ]
    path = tmp_path / "spec.toml"
    path.write_text(tomlkit.dumps(minimal_spec(arms=arms)))
    result = CliRunner().invoke(cli, ["validate", str(path)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    (line,) = [line for line in result.output.splitlines() if "arms[1].schedule" in line]
    assert "first + last = 2 + 2 protects all the model's 4 layers" in line
