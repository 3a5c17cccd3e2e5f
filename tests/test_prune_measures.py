"""What a spec that only prunes measures and probes (issue 39): ``measure = "all"`` (the default)
is the registered pairs its [prune] arms read, the probe runs only when something reads its
clouds, and a run directory pinned before keeps every pair it recorded and its stage keys."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import tomlkit
from rich.text import Text

from geospec.pipeline.run_dir import LIMITED, pin_measures
from geospec.pipeline.status import status
from geospec.registry.loading import get_registries
from geospec.rundir.layout import MEASURES_FILE
from geospec.spec.loading import validate_spec
from geospec.spec.resolve import measures, probes, registered_measures
from geospec.spec.sections import Spec
from geospec.storage.digests import sealed
from geospec.testing import minimal_spec, registered

UNIFORM = {"name": "uniform", "schedule": {"kind": "uniform"}}
FLAP = {"name": "flap", "schedule": {"kind": "flap"}}
SHIFT = {"name": "shift", "schedule": {"kind": "geometric", "profile": "shift/spherical"}}

#: A geometry registered only where a test says so: pairs that no [prune] arm reads (and one
#: that an arm may read, "shift/taxicab").
TAXICAB = """
from typing import Literal

from geospec import hookimpl
from geospec.kinds import Geometry
from geospec.plugin import PluginParams


class Taxicab(Geometry):
    class Params(PluginParams):
        kind: Literal["taxicab"] = "taxicab"

    scale_sensitive = True

    def prepare(self, cloud):
        return cloud.double()

    def pairwise(self, points):
        import torch

        return torch.cdist(points, points, p=1)

    def paired(self, a, b):
        return (a - b).abs().sum(dim=1)


@hookimpl
def geospec_register_geometries(register):
    register(Taxicab)
"""


def taxicab() -> types.ModuleType:
    module = types.ModuleType("taxicab_geometry")
    # dont_inherit: this module's `from __future__ import annotations` would make the plugin's
    # Literal a string its registration cannot read
    exec(compile(TAXICAB, "taxicab_geometry.py", "exec", dont_inherit=True), module.__dict__)
    return module


def registered_profiles() -> set[str]:
    return {f"{s}/{g}" for s, g in get_registries().all_measures()}


def pruning(*arms: dict[str, Any], **sections: Any) -> dict[str, Any]:
    """A spec dictionary that only prunes (no [[arms]], no [train], measure left at "all")."""
    spec = minimal_spec(reference={"checkpoint": "model"}, prune={"keep": 0.5, "arms": list(arms)})
    for name in ("arms", "train", "measure"):
        spec.pop(name)
    spec["data"].pop("tokenizer")  # the checkpoint's own
    for name, value in sections.items():  # as minimal_spec applies them
        if isinstance(value, dict) and isinstance(spec.get(name), dict):
            spec[name].update(value)
        else:
            spec[name] = value
    return spec


def profiles_of(spec: Spec) -> set[str]:
    return {entry.profile for entry in spec.measure or []}


# -- measure = "all" in a spec that only prunes ----------------------------------------------


def test_all_in_a_spec_that_only_prunes_is_the_pairs_its_arms_read() -> None:
    every = registered_profiles()
    assert "shift/spherical" in every and len(every) > 1  # so that "all" has pairs to leave out
    scores = validate_spec(pruning(UNIFORM, FLAP))
    assert scores.arms == [] and measures(scores) == []
    assert not probes(scores)  # nothing reads the clouds
    geometric = validate_spec(pruning(UNIFORM, FLAP, SHIFT))
    assert {entry.profile for entry in measures(geometric)} == {"shift/spherical"}
    assert probes(geometric)
    # the diagnose stage reads the probe's clouds whatever is measured
    assert probes(validate_spec(pruning(UNIFORM, FLAP, diagnose={"enabled": True})))
    # demand reads the probe's settings and key, not its clouds
    assert not probes(validate_spec(pruning(UNIFORM, FLAP, demand={"enabled": True})))
    # a spec that trains arms keeps "all" = every registered pair (its report shows them all)
    training = validate_spec({k: v for k, v in minimal_spec().items() if k != "measure"})
    assert {entry.profile for entry in measures(training)} == every
    # a list is the list, in a pruning spec too
    listed = pruning(UNIFORM, measure=[{"geometry": "raw", "statistic": "gw"}])
    assert [entry.profile for entry in measures(validate_spec(listed))] == ["gw/raw"]


def test_a_first_run_pins_every_registered_pair_and_measures_those_its_arms_read(
    tmp_path: Path,
) -> None:
    """measures.json records every pair registered when the run began (marked limited): a
    [prune] arm added later finds the pair it reads; a plugin whose pairs no arm reads is
    worth no note, one whose pair an arm reads is."""
    said: list[str] = []
    first = pin_measures(validate_spec(pruning(UNIFORM, FLAP)), tmp_path, said.append)
    assert first.measure == [] and said == []
    record = json.loads((tmp_path / MEASURES_FILE).read_text())
    assert record[LIMITED] is True
    assert record["measure"] == [entry.key_form() for entry in registered_measures()]
    added = pin_measures(validate_spec(pruning(UNIFORM, FLAP, SHIFT)), tmp_path, said.append)
    assert profiles_of(added) == {"shift/spherical"} and said == []
    assert json.loads((tmp_path / MEASURES_FILE).read_text()) == record  # the record stays

    with registered(taxicab()):
        assert "shift/taxicab" in registered_profiles()  # "all" would mean more now
        again = pin_measures(validate_spec(pruning(UNIFORM, SHIFT)), tmp_path, said.append)
        assert profiles_of(again) == {"shift/spherical"} and said == []  # no arm reads taxicab
        reads = {"name": "taxi", "schedule": {"kind": "geometric", "profile": "shift/taxicab"}}
        spec = validate_spec(pruning(UNIFORM, SHIFT, reads))
        kept = pin_measures(spec, tmp_path, said.append)
    assert profiles_of(kept) == {"shift/spherical"}  # the run keeps what it pinned
    [said_once] = said
    note = Text.from_markup(said_once).plain  # as the console shows it
    assert "the plugins installed now adds shift/taxicab:" in note
    assert "gw/taxicab" not in note and "that its [prune] arms read" in note


def test_a_run_pinned_before_keeps_every_pair_and_says_nothing(tmp_path: Path) -> None:
    """A measures.json written before "all" depended on the arms (no limited mark) holds the
    measures in effect: every pair, so that the run keeps its measure key; no note."""
    every = [entry.key_form() for entry in registered_measures()]
    (tmp_path / MEASURES_FILE).write_text(json.dumps(sealed({"measure": every})))
    (tmp_path / "run.json").write_text(json.dumps({"name": "t", "arms": [], "seeds": [0]}))
    said: list[str] = []
    spec = pin_measures(validate_spec(pruning(UNIFORM, FLAP)), tmp_path, said.append)
    assert [entry.key_form() for entry in spec.measure or []] == every and said == []
    assert status(tmp_path)["notes"] == []


# -- the pipeline: what a prune writes -------------------------------------------------------


def prune_only_spec(directory: Path, *arms: dict[str, Any], **sections: Any) -> Path:
    """The tiny word-level checkpoint of test_prune pruned by ``arms`` (measure at "all")."""
    sys.path.insert(0, str(Path(__file__).parent))
    from test_prune import word_checkpoint, word_corpus

    if not (directory / "model").exists():
        word_checkpoint(directory / "model")
        word_corpus(directory / "docs.jsonl", 0)
    defaults: dict[str, Any] = {
        "out": str(directory / "run"),
        "model": {"seq_len": 16, "multiple_of": 8},
        "data": {"files": ["docs.jsonl"]},
        "probe": {"tokens": 64},
    }
    spec = pruning(*arms, **(defaults | sections))
    for name in ("n_layers", "d_model", "n_heads", "ffn_width"):  # read from the checkpoint
        spec["model"].pop(name)
    spec["prune"] |= {
        "calibration": {"windows": 4},
        "eval": {"corpora": ["docs.jsonl"], "windows": 4},
    }
    path = directory / "spec.toml"
    path.write_text(tomlkit.dumps(spec))
    return path


def invoke(*args: str) -> str:
    from click.testing import CliRunner

    from geospec.cli import cli

    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code == 0, result.output + repr(result.exception)
    return result.output


def files(run: Path) -> set[str]:
    return {str(path.relative_to(run)) for path in run.rglob("*") if path.is_file()}


@pytest.mark.torch
@pytest.mark.usefixtures("one_torch_thread")
def test_a_prune_of_uniform_and_flap_probes_and_measures_nothing(tmp_path: Path) -> None:
    """Nothing reads a cloud or a profile: no clouds/, no profile; the prune, its report and
    status are whole. A geometric arm added later probes and measures exactly its pair."""
    run = tmp_path / "run"
    spec = prune_only_spec(tmp_path, UNIFORM, FLAP)
    output = invoke("prune", str(spec))
    assert "probe: not needed" in output and "measure:" not in output
    assert not (run / "clouds").exists()
    assert json.loads((run / "profiles.json").read_text())["profiles"] == {}
    assert (run / "prune.json").exists()
    stages = json.loads((run / "stages.json").read_text())
    assert "probe" not in stages and {"measure", "prune"} <= set(stages)
    invoke("run", str(spec))  # the report too
    report = (run / "report.md").read_text()
    assert "## Pruning the reference" in report
    found = status(run)
    states = {stage["name"]: stage["state"] for stage in found["stages"]}
    assert states["probe"] == "skipped" and "pending" not in states.values(), states
    assert found["notes"] == []
    with registered(taxicab()):  # a plugin no [prune] arm reads: nothing to say
        assert status(run)["notes"] == []
    assert "nothing to do" in invoke("run", str(spec))  # and nothing left to do

    before = files(run)
    prune_only_spec(tmp_path, UNIFORM, FLAP, SHIFT)
    output = invoke("prune", str(spec))
    assert "measure: 1 profiles" in output
    assert set(json.loads((run / "profiles.json").read_text())["profiles"]) == {"shift/spherical"}
    probed = files(run) - before
    assert {name for name in probed if name.startswith("clouds/")} == {
        "clouds/meta.json",
        *(f"clouds/layer-{layer:03d}.safetensors" for layer in range(3)),  # 3 layers
    }
    assert json.loads((run / "stages.json").read_text())["probe"]


@pytest.mark.torch
@pytest.mark.usefixtures("one_torch_thread")
def test_a_prune_run_pinned_to_every_pair_before_keeps_its_keys(tmp_path: Path) -> None:
    """A run directory that measured every registered pair (as "all" meant before) keeps them,
    its measure key and every other, with the spec at "all": nothing to do, no note."""
    run = tmp_path / "run"
    every = [entry.key_form() for entry in registered_measures()]
    tables = [{k: v for k, v in table.items() if v is not None} for table in every]  # TOML
    listed = prune_only_spec(tmp_path, UNIFORM, FLAP, SHIFT, measure=tables)
    invoke("prune", str(listed))
    keys = json.loads((run / "stages.json").read_text())
    profiles = json.loads((run / "profiles.json").read_text())["profiles"]
    assert set(profiles) == registered_profiles()
    # as an earlier geospec pinned measure = "all": every pair, no limited mark
    (run / MEASURES_FILE).write_text(json.dumps(sealed({"measure": every})))
    spec = prune_only_spec(tmp_path, UNIFORM, FLAP, SHIFT)  # measure = "all" again
    output = invoke("prune", str(spec))
    assert "nothing to do" in output and "was resolved when this run began" not in output
    assert json.loads((run / "stages.json").read_text()) == keys
    assert json.loads((run / "profiles.json").read_text())["profiles"] == profiles
    assert status(run)["notes"] == []


@pytest.mark.torch
@pytest.mark.usefixtures("one_torch_thread")
def test_a_diagnose_turned_off_keeps_its_record_while_nothing_is_probed(tmp_path: Path) -> None:
    """diagnostics.json of the same reference and probe settings stays in the report after
    [diagnose] is turned off, though the probe then does not apply (its key is not recorded);
    one from another probe is dropped, as before."""
    run = tmp_path / "run"
    diagnose = {"enabled": True, "windows": 4, "pairs": 1}
    invoke("prune", str(prune_only_spec(tmp_path, UNIFORM, FLAP, diagnose=diagnose)))
    assert (run / "clouds" / "meta.json").exists()  # the diagnose stage reads the clouds
    measured = (run / "diagnostics.json").read_bytes()
    off = prune_only_spec(tmp_path, UNIFORM, FLAP, diagnose=diagnose | {"enabled": False})
    assert "probe: not needed" in invoke("run", str(off))
    assert (run / "diagnostics.json").read_bytes() == measured
    assert "## Diagnostics" in (run / "report.md").read_text()
    other = prune_only_spec(
        tmp_path, UNIFORM, FLAP, diagnose=diagnose | {"enabled": False}, probe={"tokens": 32}
    )
    invoke("run", str(other))
    assert not (run / "diagnostics.json").exists()
