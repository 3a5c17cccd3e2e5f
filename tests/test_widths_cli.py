"""``geospec widths`` and the library behind it: every arm's widths, equal FFN budgets."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import pytest
from click.testing import CliRunner

from geospec import hookimpl
from geospec.cli import cli
from geospec.errors import PluginError, SpecError, UsageError
from geospec.kinds import Geometry, ModelDims, Schedule, Statistic
from geospec.plugin import PluginParams
from geospec.profiles import read_profiles
from geospec.registry.entries import Provider
from geospec.registry.hookspecs import Register
from geospec.registry.loading import build_registries, use_registries
from geospec.solve.widths import (
    WidthsResult,
    arm_order,
    bounds_note,
    bounds_problems,
    compute_widths,
    dependency_cycle,
    layers_at_bounds,
    width_problems,
)
from geospec.spec.loading import load_spec
from geospec.spec.sections import ModelSpec, Spec

PROFILE = "testwork/testflat"


class FlatGeometry(Geometry):
    """A geometry name for specs to measure; these tests read profiles from files, never measure."""

    class Params(PluginParams):
        kind: Literal["testflat"] = "testflat"


class WorkStatistic(Statistic):
    class Params(PluginParams):
        kind: Literal["testwork"] = "testwork"


class Given(Schedule):
    """A third-party schedule that returns its list unchecked (a broken one, given a bad list)."""

    class Params(PluginParams):
        kind: Literal["testgiven"] = "testgiven"
        widths: list[int]
        bounds: list[int] | None = None

    params: Params

    def widths(self, dims: ModelDims, profiles: Mapping[str, Sequence[float]]) -> list[int]:
        return list(self.params.widths)

    def bounds(self, dims: ModelDims) -> tuple[int, int] | None:
        b = self.params.bounds
        return None if b is None else (b[0], b[1])


class MeasuresForTests:
    @hookimpl
    def geospec_register_geometries(self, register: Register) -> None:
        register(FlatGeometry)

    @hookimpl
    def geospec_register_statistics(self, register: Register) -> None:
        register(WorkStatistic)

    @hookimpl
    def geospec_register_schedules(self, register: Register) -> None:
        register(Given)


@pytest.fixture(autouse=True)
def registries() -> Iterator[None]:
    """The builtins plus a measurable profile named 'testwork/testflat'."""
    extra = [(MeasuresForTests(), Provider("geospec-widths-tests", "0"))]
    with use_registries(build_registries(entry_points=False, extra=extra)):
        yield


ARMS = """
[[arms]]
name = "uniform"
schedule = { kind = "uniform" }

[[arms]]
name = "cosine"
schedule = { kind = "cosine" }

[[arms]]
name = "manual"
schedule = { kind = "manual", widths = [768, 640, 512, 512, 384, 256] }

[[arms]]
name = "geo"
schedule = { kind = "geometric", profile = "testwork/testflat",
             smoother = { kind = "gaussian", sigma = 1.0 },
             solver = { kind = "power_law", min_ratio = 0.25, max_ratio = 2.0 } }

[[arms]]
name = "anti"
schedule = { kind = "anti", profile = "testwork/testflat" }

[[arms]]
name = "shuffled"
schedule = { kind = "permuted", profile = "testwork/testflat", seed = 3 }
"""


def write_spec(
    tmp_path: Path,
    activation: str = "gelu",
    arms: str = ARMS,
    extra: str = "",
    ffn_width: int = 512,
    tokenizer: str = '{ kind = "bpe", vocab_size = 512 }',
) -> Path:
    spec = f"""
name = "widths-test"
out = "{tmp_path / "run"}"
{extra}
[model]
n_layers = 6
d_model = 64
n_heads = 4
ffn_width = {ffn_width}
activation = "{activation}"
seq_len = 32
multiple_of = 64

[data]
tokenizer = {tokenizer}

[[measure]]
geometry = "testflat"
statistic = "testwork"
{arms}
[train]
steps = 10
"""
    path = tmp_path / "spec.toml"
    path.write_text(spec)
    return path


def write_profiles(tmp_path: Path, data: Any, name: str = "profiles.json") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


FRONT_LOADED = [9.0, 6.0, 4.0, 3.0, 2.0, 1.5]


def run(*args: str) -> Any:
    return CliRunner().invoke(cli, ["widths", *map(str, args)])


def uniform_ffn_params(activation: str, n_layers: int = 6, d: int = 64, width: int = 512) -> int:
    # gelu: up (d x w + w) and down (w x d + d); swiglu: gate and up (2 x (d x w + w)), down.
    matrices, hidden_biases = (3, 2) if activation == "swiglu" else (2, 1)
    return n_layers * (matrices * d * width + hidden_biases * width + d)


def test_json_without_profiles_lists_geometric_arms_as_pending(tmp_path: Path) -> None:
    result = run(write_spec(tmp_path), "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert set(data) == {"arms", "pending"}
    assert list(data["arms"]) == ["uniform", "cosine", "manual"]
    assert data["pending"] == ["geo", "anti", "shuffled"]
    for arm in data["arms"].values():
        assert set(arm) == {"widths", "ffn_params", "bounds"}
        assert arm["ffn_params"] == uniform_ffn_params("gelu")
    assert data["arms"]["manual"]["widths"] == [768, 640, 512, 512, 384, 256]
    assert not (tmp_path / "run").exists()  # geospec widths never writes into a run directory
    written = run(write_spec(tmp_path), "--json", "--output", tmp_path / "planned.json")
    assert written.exit_code == 0, written.output
    assert json.loads((tmp_path / "planned.json").read_text()) == data


@pytest.mark.parametrize("activation", ["gelu", "swiglu"])
def test_with_profiles_every_arm_has_the_uniform_ffn_parameter_count(
    tmp_path: Path, activation: str
) -> None:
    profiles = write_profiles(tmp_path, {"profiles": {PROFILE: FRONT_LOADED}, "layers": 6})
    result = run(write_spec(tmp_path, activation), "--profiles", profiles, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["pending"] == []
    assert list(data["arms"]) == ["uniform", "cosine", "manual", "geo", "anti", "shuffled"]
    for arm in data["arms"].values():
        assert sum(arm["widths"]) == 6 * 512 and all(w % 64 == 0 for w in arm["widths"])
        assert arm["ffn_params"] == uniform_ffn_params(activation)
    geo, anti = data["arms"]["geo"]["widths"], data["arms"]["anti"]["widths"]
    assert geo == sorted(geo, reverse=True) and anti == sorted(anti) and geo != anti
    # the permuted control: the widths of the geometric schedule with its own settings (no
    # smoother, default solver), in another layer order
    plain = ARMS + '[[arms]]\nname = "plain"\nschedule = { kind = "geometric", profile = "%s" }\n'
    (tmp_path / "plain").mkdir()
    plain_spec = load_spec(write_spec(tmp_path / "plain", activation, arms=plain % PROFILE))
    unshuffled = spec_widths(plain_spec, {PROFILE: FRONT_LOADED}).widths["plain"]
    shuffled = data["arms"]["shuffled"]["widths"]
    assert sorted(shuffled) == sorted(unshuffled) and shuffled != unshuffled
    assert not (tmp_path / "run" / "widths.json").exists()


GIVEN = '[[arms]]\nname = "given"\nschedule = {{ kind = "testgiven", widths = {} }}\n'


@pytest.mark.parametrize(
    ("widths", "problem"),
    [
        ([768, 640, 512, 512, 384, 320], "widths sum to 3136, not the budget 3072"),
        ([768, 640, 512, 512, 640], "5 widths for 6 layers"),
        ([768, 640, 512, 512, 400, 240], "widths must be positive multiples of 64"),
        ([1024, 1024, 512, 512, 64, -64], "widths must be positive multiples of 64"),
        ([1024, 1024, 512, 512, 0, 0], "widths must be positive multiples of 64"),
        ([768, 640], "2 widths for 6 layers; widths sum to 1408, not the budget 3072"),
    ],
)
def test_a_schedule_that_breaks_the_budget_is_stopped(
    tmp_path: Path, widths: list[int], problem: str
) -> None:
    """The budget check on every schedule's output: a plugin cannot smuggle in other widths."""
    spec = load_spec(write_spec(tmp_path, arms=ARMS + GIVEN.format(widths)))
    with pytest.raises(PluginError) as raised:
        spec_widths(spec, {PROFILE: FRONT_LOADED})
    assert str(raised.value) == f"arm 'given': schedule 'testgiven' returned {widths}: {problem}"
    result = run(tmp_path / "spec.toml", "--profiles", write_profiles(tmp_path, {"profiles": {}}))
    assert result.exit_code == 2 and problem in result.output and "Traceback" not in result.output


@pytest.mark.parametrize(
    ("bounds", "problem"),
    [
        ([128, 512], "widths outside its own bounds [128, 512]: layer 0: 1024, layer 1: 1024"),
        ([256, 1024], "widths outside its own bounds [256, 1024]: layer 4: 128, layer 5: 128"),
        ([1024, 128], "bounds [1024, 128] are not [lower, upper] with lower <= upper"),
    ],
)
def test_a_schedule_whose_widths_leave_its_own_bounds_is_stopped(
    tmp_path: Path, bounds: list[int], problem: str
) -> None:
    """The bounds a report marks layers against are checked to hold the widths they come with."""
    widths = [1024, 1024, 512, 256, 128, 128]
    given = GIVEN.format(widths).replace(" }", f", bounds = {bounds} }}")
    spec = load_spec(write_spec(tmp_path, arms=ARMS + given))
    with pytest.raises(PluginError) as raised:
        spec_widths(spec, {PROFILE: FRONT_LOADED})
    assert str(raised.value) == f"arm 'given': schedule 'testgiven' returned {widths}: {problem}"


SOLVER_BOUNDS = """
[[arms]]
name = "geo"
schedule = {{ kind = "geometric", profile = "testwork/testflat",
             solver = {{ kind = "power_law", min_ratio = {low}, max_ratio = {high} }} }}

[[arms]]
name = "anti"
schedule = {{ kind = "anti", profile = "testwork/testflat",
             solver = {{ kind = "proportional", min_ratio = {low}, max_ratio = {high} }} }}

[[arms]]
name = "uniform"
schedule = {{ kind = "uniform" }}

[[arms]]
name = "cosine"
schedule = {{ kind = "cosine" }}

[[arms]]
name = "manual"
schedule = {{ kind = "manual", widths = [768, 640, 512, 512, 384, 256] }}
"""


@pytest.mark.parametrize(("low", "high"), [(0.25, 2.0), (0.3, 1.9), (0.5, 1.25)])
def test_widths_json_records_each_arms_bounds_and_the_table_names_layers_at_them(
    tmp_path: Path, low: float, high: float
) -> None:
    """A solver's bounds are its ratios of the uniform width (512) rounded inward to multiples of
    64; a fixed taper or a list has none. One layer with all the work wants far more than the
    upper bound allows and sits at it; the others share the rest."""
    spec = write_spec(tmp_path, arms=SOLVER_BOUNDS.format(low=low, high=high))
    steep = [100.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    profiles = write_profiles(tmp_path, {"profiles": {PROFILE: steep}, "layers": 6})
    result = run(spec, "--profiles", profiles, "--json")
    assert result.exit_code == 0, result.output
    arms = json.loads(result.stdout)["arms"]
    expected = [math.ceil(low * 512 / 64) * 64, math.floor(high * 512 / 64) * 64]
    assert arms["geo"]["bounds"] == arms["anti"]["bounds"] == expected
    assert arms["uniform"]["bounds"] is arms["cosine"]["bounds"] is arms["manual"]["bounds"] is None
    geo = arms["geo"]["widths"]
    assert geo[0] == expected[1] and all(expected[0] <= w < expected[1] for w in geo[1:])
    table = run(spec, "--profiles", profiles)
    assert table.exit_code == 0, table.output
    assert f"bounds: geo layer 0 at the upper bound {expected[1]}" in table.output
    assert "bounds: uniform" not in table.output and "bounds: manual" not in table.output


def test_the_note_on_layers_at_bounds_names_runs_of_layers() -> None:
    widths = [1024, 1024, 1024, 512, 1024, 256, 128]
    assert layers_at_bounds(widths, [128, 1024]) == ([6], [0, 1, 2, 4])
    assert (
        bounds_note(widths, [128, 1024])
        == "layers 0-2, 4 at the upper bound 1024; layer 6 at the lower bound 128"
    )
    assert bounds_note(widths, [64, 2048]) is None  # no layer at either bound
    assert bounds_note(widths, None) is None and layers_at_bounds(widths, None) == ([], [])
    assert bounds_note(widths, [256, 2048]) == "layer 5 at the lower bound 256"
    assert bounds_note([64, 64, 128, 64], [64, 512]) == "layers 0-1, 3 at the lower bound 64"
    assert bounds_note([512, 64, 512, 64], [64, 512]) == (
        "layers 0, 2 at the upper bound 512; layers 1, 3 at the lower bound 64"
    )


@pytest.mark.parametrize(
    ("bounds", "problem"),
    [
        (None, None),
        ((128, 1024), None),
        ((512, 512), None),  # every width pinned: sound
        ((128.0, 1024), "bounds [128.0, 1024] are not [lower, upper] with lower <= upper"),
        ((True, 1024), "bounds [True, 1024] are not [lower, upper] with lower <= upper"),
        ((128, 512, 1024), "bounds [128, 512, 1024] are not [lower, upper] with lower <= upper"),
        ((1024, 128), "bounds [1024, 128] are not [lower, upper] with lower <= upper"),
        ((513, 1024), "widths outside its own bounds [513, 1024]: layer 0: 512, layer 1: 512"),
        ((128, 511), "widths outside its own bounds [128, 511]: layer 0: 512, layer 1: 512"),
    ],
)
def test_bounds_must_be_an_ordered_pair_of_integers_holding_every_width(
    bounds: tuple[Any, ...] | None, problem: str | None
) -> None:
    assert bounds_problems([512, 512], bounds) == ([problem] if problem else [])


def test_arm_order_puts_sources_first_and_refuses_unknown_sources_and_cycles() -> None:
    """What spec validation reports first, held by the function itself (a library entry)."""
    assert arm_order({"a": ["c"], "b": [], "c": ["b"]}) == ["b", "c", "a"]
    assert dependency_cycle({"a": ["b"], "b": ["c"], "c": ["b"]}) == ["b", "c", "b"]
    assert dependency_cycle({"a": ["b", "x"], "b": []}) is None  # unknown names are not cycles
    with pytest.raises(UsageError) as raised:
        arm_order({"a": ["x", "y"]})
    assert str(raised.value) == "arm 'a' reads the widths of 'x', which is no arm"
    with pytest.raises(UsageError) as raised:
        arm_order({"a": ["b"], "b": ["a"]})
    assert str(raised.value) == "arms read each other's widths in a cycle: a -> b -> a"


def test_width_problems_accept_every_positive_width() -> None:
    """Width 1 is a width: the checks start at 1 (multiple_of 1, and --widths of geospec train)."""
    model = ModelSpec(n_layers=2, d_model=32, n_heads=2, ffn_width=64, seq_len=16, multiple_of=1)
    assert width_problems([1, 127], model, multiples=True) == []
    assert width_problems([1, 127], model, multiples=False) == []
    assert width_problems([0, 128], model, multiples=False) == ["widths must be positive"]
    assert width_problems([-1, 129], model, multiples=True) == [
        "widths must be positive multiples of 1"
    ]


def test_library_errors_name_the_arm_and_the_source_only_when_given(tmp_path: Path) -> None:
    spec = load_spec(write_spec(tmp_path))
    short = {PROFILE: [3.0, 2.0, 1.0]}  # the spec's own reference has 6 layers: not resampled
    expected = f"arm 'geo': profile {PROFILE!r} has 3 values but the reference model has 6 layers"
    with pytest.raises(UsageError) as raised:
        compute_widths(spec.model, spec.arms, short)
    assert str(raised.value).startswith(expected)
    with pytest.raises(UsageError) as raised:
        compute_widths(spec.model, spec.arms, short, profiles_source="p.json")
    assert str(raised.value).startswith(f"p.json: {expected}")


FROM_FILE = """
[[arms]]
name = "transfer"
schedule = {{ kind = "geometric", profile = "{profile}", profiles = "{path}" }}
"""


def test_an_arm_reading_a_profiles_file_waits_for_it_then_names_what_it_lacks(
    tmp_path: Path,
) -> None:
    path = tmp_path / "other" / "profiles.json"
    spec = load_spec(write_spec(tmp_path, arms=FROM_FILE.format(profile=PROFILE, path=path)))
    waiting = compute_widths(spec.model, spec.arms)
    assert waiting.pending == {"transfer": [PROFILE]}
    assert waiting.notes == {
        "transfer": f"reads its profiles from {path}, which does not exist yet; run the spec "
        "that measures them first"
    }
    path.parent.mkdir()
    for held, listed in (({"a/b": [1.0], "c/d": [2.0]}, "'a/b', 'c/d'"), ({}, "none")):
        path.write_text(json.dumps({"profiles": held}))
        with pytest.raises(UsageError) as raised:
            compute_widths(spec.model, spec.arms)
        message = f"arm 'transfer': {path} has no profile {PROFILE!r} (it has {listed})"
        assert str(raised.value) == message


def test_a_third_party_schedule_on_budget_is_an_arm_like_any_other(tmp_path: Path) -> None:
    widths = [1024, 1024, 512, 256, 128, 128]
    spec = load_spec(write_spec(tmp_path, arms=ARMS + GIVEN.format(widths)))
    result = spec_widths(spec, {PROFILE: FRONT_LOADED})
    assert result.widths["given"] == widths
    assert result.ffn_params["given"] == uniform_ffn_params("gelu")


def test_table_has_a_column_per_arm_and_a_totals_row(tmp_path: Path) -> None:
    result = run(write_spec(tmp_path))
    assert result.exit_code == 0, result.output
    out = result.stdout
    for text in ("uniform", "cosine", "manual", "total", "512 · 66,112", "3,072 · 396,672"):
        assert text in out
    assert "pending:" in out and "'testwork/testflat'" in out and "wrote" not in out


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ("{not json", "profiles.json:1:2: invalid JSON"),
        ('{"layers": [1]}', "without a 'profiles' key"),
        ('{"profiles": [1, 2]}', "'profiles' holding a list"),
        ('{"profiles": {"testwork/testflat": [1, -1, 1, 1, 1, 1]}}', "layer 1 is -1.0"),
        ('{"profiles": {"testwork/testflat": [1, NaN, 1, 1, 1, 1]}}', "layer 1 is nan"),
        ('{"profiles": {"testwork/testflat": "1 2 3"}}', "must be a list of numbers"),
        (
            '{"profiles": {"testwork/testflat": [1, 2, 3]}}',
            "profiles.json: arm 'geo': profile 'testwork/testflat' has 3 values but the reference "
            "model has 6 layers",
        ),
        ('{"profiles": {"testwork/testflat": [0, 0, 0, 0, 0, 0]}}', "all 6 values are zero"),
    ],
)
def test_bad_profiles_exit_2_naming_the_problem(
    tmp_path: Path, content: str, fragment: str
) -> None:
    profiles = write_profiles(tmp_path, content)
    result = run(write_spec(tmp_path), "--profiles", profiles)
    assert result.exit_code == 2
    assert fragment in result.output
    assert "Traceback" not in result.output


def test_missing_profiles_file(tmp_path: Path) -> None:
    result = run(write_spec(tmp_path), "--profiles", tmp_path / "nope.json")
    assert result.exit_code == 2 and "nope.json: no such profiles file" in result.output


def test_a_pretrained_reference_of_another_depth_is_resampled(tmp_path: Path) -> None:
    # A 4-layer checkpoint (its config is all validate reads) and a spec training a 6-layer
    # target from its profiles: a given [model] value is the target's in a spec that trains.
    (tmp_path / "some" / "model-dir").mkdir(parents=True)
    config = {"model_type": "gpt2", "n_layer": 4, "n_embd": 48, "n_head": 2, "vocab_size": 512}
    (tmp_path / "some" / "model-dir" / "config.json").write_text(json.dumps(config))
    pretrained = write_spec(
        tmp_path,
        extra='[reference]\ncheckpoint = "some/model-dir"\n',
        tokenizer='{ kind = "pretrained", path = "some/model-dir" }',
    )
    spec = load_spec(pretrained)
    assert spec.model.n_layers == 6 and spec.model.d_model == 64
    result = spec_widths(spec, {PROFILE: [8.0, 4.0, 2.0, 1.0]})  # a 4-layer reference
    geo = result.widths["geo"]
    assert len(geo) == 6 and sum(geo) == 6 * 512 and geo == sorted(geo, reverse=True)
    with pytest.raises(UsageError, match="arm 'geo': profile 'testwork/testflat' is empty"):
        spec_widths(spec, {PROFILE: []})
    # The command says it resampled (a wrong n_layers would otherwise pass unseen).
    profiles = write_profiles(tmp_path, {"profiles": {PROFILE: [8.0, 4.0, 2.0, 1.0]}})
    result = CliRunner().invoke(cli, ["widths", str(pretrained), "--profiles", str(profiles)])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert f"note: profiles of 4 layers ({profiles}) resampled to the model's 6 layers" in said


def test_read_profiles_keeps_all_zero_profiles_for_arms_that_do_not_use_them(
    tmp_path: Path,
) -> None:
    path = write_profiles(tmp_path, {"profiles": {"a/b": [0, 0], PROFILE: FRONT_LOADED}})
    assert read_profiles(path) == {"a/b": [0.0, 0.0], PROFILE: FRONT_LOADED}


def test_spec_validation_reaches_into_nested_tables(tmp_path: Path) -> None:
    bad_sigma = ARMS.replace("sigma = 1.0", "sigma = -1.0")
    with pytest.raises(SpecError, match=r"arms\[3\]\.schedule\.smoother\.sigma"):
        load_spec(write_spec(tmp_path, arms=bad_sigma))
    # A uniform width of 8.5 multiples: each layer must take 8 or 9, so min_ratio <= 8 / 8.5.
    tight = ARMS.replace("min_ratio = 0.25", "min_ratio = 0.99")
    with pytest.raises(SpecError) as raised:
        load_spec(write_spec(tmp_path, arms=tight, ffn_width=544))
    message = str(raised.value)
    assert "arms[2].schedule: widths sum to 3072, but the budget is 3264" in message
    assert "arms[3].schedule: solver power_law: min_ratio 0.99" in message
    assert "min_ratio <= 0.941176 and max_ratio >= 1.05882" in message
    missing = ARMS.replace('profile = "testwork/testflat" }', 'profile = "gw/raw" }', 1)
    with pytest.raises(SpecError, match=r"arms\[4\]\.schedule\.profile: 'gw/raw' is not measured"):
        load_spec(write_spec(tmp_path, arms=missing))


def test_widths_does_not_import_torch(tmp_path: Path) -> None:
    arms = ARMS.split('[[arms]]\nname = "geo"')[0]
    spec = write_spec(tmp_path, arms=arms.replace("[[measure]]", "")).read_text()
    spec = spec.replace('[[measure]]\ngeometry = "testflat"\nstatistic = "testwork"\n', "")
    spec = spec.replace('name = "widths-test"', 'name = "widths-test"\nmeasure = []')
    path = tmp_path / "light.toml"
    path.write_text(spec)
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "geospec", "widths", str(path), "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines() if "|" in line}
    assert "json" in imported  # the import log was captured
    assert not {name for name in imported if name.split(".")[0] == "torch"}
    assert json.loads(done.stdout)["pending"] == []


def spec_widths(spec: Spec, profiles: dict[str, list[float]]) -> WidthsResult:
    pretrained = spec.reference.checkpoint is not None
    return compute_widths(spec.model, spec.arms, profiles, pretrained_reference=pretrained)


def test_profiles_from_several_files_are_merged_and_a_duplicate_is_refused(
    tmp_path: Path,
) -> None:
    """--profiles twice: the files are merged (the last one no longer silently wins); the same
    profile in both is one line naming both files."""
    one = write_profiles(tmp_path, {"profiles": {PROFILE: FRONT_LOADED}}, "one.json")
    other = write_profiles(tmp_path, {"profiles": {"other/raw": [1.0] * 6}}, "other.json")
    merged = run(write_spec(tmp_path), "--profiles", one, "--profiles", other, "--json")
    assert merged.exit_code == 0, merged.output
    alone = run(write_spec(tmp_path), "--profiles", one, "--json")
    assert json.loads(merged.stdout) == json.loads(alone.stdout)  # other/raw is read, unused
    twice = write_profiles(tmp_path, {"profiles": {PROFILE: [1.0] * 6}}, "twice.json")
    clash = run(write_spec(tmp_path), "--profiles", one, "--profiles", twice)
    assert clash.exit_code == 2 and "Traceback" not in clash.output
    assert f"{PROFILE!r} is in both {one} and {twice}" in clash.output
