"""Adding an arm to a prune computes and writes only that arm's units: a unit's key is its own
arm's (the prune section with only that arm and the arms it reads), so the other arms'
records and exported models are reused as they are."""

from __future__ import annotations

import json
from pathlib import Path

import tomlkit
from test_prune import PRUNE_SPEC, invoke, prune_spec


def written(run: Path) -> dict[Path, int]:
    """Every file under the run's prune/ and when it was last written."""
    return {p: p.stat().st_mtime_ns for p in (run / "prune").rglob("*") if p.is_file()}


def test_adding_an_arm_writes_only_its_units_and_changing_one_redoes_only_it(
    tmp_path: Path,
) -> None:
    """uniform and flap, exported; then shift added: no file of uniform's or flap's units is
    written again (records and models), shift's are new, and prune.json holds all three. Then
    keep 0.75 added: only its units are computed. Then flap's importance changed: flap's units
    alone are computed again."""
    spec = prune_spec(
        tmp_path, arms=PRUNE_SPEC["arms"][:2], keep=0.5,
        calibration={"windows": 8, "seeds": [0, 1]},
    )  # fmt: skip
    invoke("prune", str(spec))
    run = tmp_path / "run"
    before = written(run)
    models = [p for p in before if p.parent.name == "model"]
    assert {p.parts[-4] for p in models} == {"uniform", "flap"}  # both exported
    data = tomlkit.parse(spec.read_text())
    data["prune"]["arms"].append(PRUNE_SPEC["arms"][4])  # type: ignore[index, union-attr]
    spec.write_text(tomlkit.dumps(data))
    output = invoke("prune", str(spec))
    after = written(run)
    rewritten = [
        p for p, stamp in before.items()
        if "seed-" in str(p) and after.get(p) != stamp
    ]  # fmt: skip
    assert rewritten == [], output
    new = {p.relative_to(run / "prune").parts[:3] for p in after if p not in before}
    assert {parts[1] for parts in new if len(parts) == 3} == {"shift"}
    record = json.loads((run / "prune.json").read_text())
    assert set(record["budgets"][0]["arms"]) == {"uniform", "flap", "shift"}
    assert "pruned models" in output  # shift's two units were computed
    data["prune"]["keep"] = [0.75, 0.5]  # type: ignore[index]
    spec.write_text(tomlkit.dumps(data))
    again = written(run)
    invoke("prune", str(spec))
    assert [p for p, stamp in again.items() if "seed-" in str(p) and written(run)[p] != stamp] == []
    assert len(list((run / "prune" / "keep-0.75").glob("*/seed-*/result.json"))) == 6
    flap = data["prune"]["arms"][1]  # type: ignore[index]
    flap["importance"] = {"kind": "magnitude"}  # type: ignore[index]
    spec.write_text(tomlkit.dumps(data))
    again = written(run)
    invoke("prune", str(spec))
    changed = {p.parts[-3] for p, stamp in again.items()
               if p.name == "result.json" and "seed-" in p.parent.name
               and written(run).get(p) != stamp}  # fmt: skip
    assert changed == {"flap"}


def test_the_prune_key_keeps_its_arms_keys_when_pickled_or_copied() -> None:
    """A process hands the stage's key on (pickled under torchrun and to launchers, copied):
    the copy gives every unit the key the original gives it, and equals the stage's key."""
    import copy
    import pickle

    from geospec.prune.units import PruneKey, Unit, unit_key

    key = PruneKey("stage", {"flap": "flap's own", "uniform": "uniform's own"})
    for other in (pickle.loads(pickle.dumps(key)), copy.deepcopy(key), copy.copy(key)):
        assert other == "stage" and isinstance(other, PruneKey)
        for arm in ("flap", "uniform"):
            assert unit_key(other, Unit(0.5, arm, 0)) == unit_key(key, Unit(0.5, arm, 0))
    assert unit_key(key, Unit(0.5, "flap", 0)) != unit_key("stage", Unit(0.5, "flap", 0))
