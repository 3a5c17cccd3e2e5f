"""The units of a prune: one pruned model per keep fraction x arm x calibration seed, each in
its own directory with a sealed record under its key; which of them are finished, which
``--arms/--keep`` chose, and what a prune says while another process computes one (torch-free;
``prune.json``'s content gathered from them is :mod:`geospec.prune.record`'s).

A unit's directory is ``prune/keep-<f>/<arm>/seed-<k>/``: ``result.json`` (sealed; its key names
what it was computed from), ``model/`` (the exported checkpoint, with ``export``) and ``heal/``
(the training directory of its healing, with ``heal.steps``). A unit whose record holds the
expected key is finished and reused, so an interrupted prune resumes unit by unit.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from geospec.rundir.artifacts import json_problem, read_json
from geospec.rundir.layout import UNIT_FILE, UNIT_MODEL_DIR, prune_unit_dir
from geospec.spec.sections import PruneSpec
from geospec.storage.digests import seal_broken, unsealed


@dataclass(frozen=True)
class Unit:
    """One pruned model: the share of FFN neurons kept, the arm's allocation, the calibration
    sample's seed."""

    keep: float
    arm: str
    seed: int

    def directory(self, run_dir: Path) -> Path:
        return prune_unit_dir(run_dir, self.keep, self.arm, self.seed)

    @property
    def label(self) -> str:
        """The unit as the commands name it: ``ARM@KEEP``, and its calibration seed."""
        return f"{self.arm}@{self.keep:g} (seed {self.seed})"


class PruneKey(str):
    """The prune stage's key, which also knows each arm's own key (:func:`arm_keys`): what the
    arm's units are computed from, without the other arms. A unit's key is its arm's, so adding
    an arm (or changing one) leaves the other arms' units, records and models as they are."""

    arms: dict[str, str]

    def __new__(cls, key: str, arms: Mapping[str, str]) -> PruneKey:
        made = super().__new__(cls, key)
        made.arms = dict(arms)
        return made

    def __reduce__(self) -> tuple[type[PruneKey], tuple[str, dict[str, str]]]:
        return PruneKey, (str(self), self.arms)  # pickled and copied with its arms' keys


def arm_keys(
    keyed: PruneSpec,
    common: Sequence[object],
    profiles: Mapping[str, Sequence[float]],
    block_arms: Collection[str],
    repaired_searches: Collection[str] = (),
) -> dict[str, str]:
    """Each arm's key: the prune section as the stage's key sees it (``keyed``) with only the
    arm and the arms it reads (its baseline itself) and no keep fractions or calibration seeds
    (a unit's key names its own), the stage's other key parts (``common``:
    the reference, data, model and dtype keys), and of ``profiles``, ``block_arms`` (the
    arms that read every block's linears) and ``repaired_searches`` (:func:`repaired_searches`)
    only those of these arms."""
    from geospec.plugin import create_plugin
    from geospec.spec.resolve import prune_profiles
    from geospec.storage.digests import digest

    reads = {a.name: create_plugin("schedule", a.schedule).required_arms() for a in keyed.arms}
    keys = {}
    for arm in keyed.arms:
        closure: set[str] = set()
        unread = [arm.name]
        while unread:
            name = unread.pop()
            if name not in closure:
                closure.add(name)
                unread += reads.get(name, [])
        alone = keyed.model_copy(
            update={
                "arms": [a for a in keyed.arms if a.name in closure],
                "baseline": arm.name,
                # a unit's key names its own keep fraction and seed: adding one adds units
                "keep": [],
                "calibration": keyed.calibration.model_copy(update={"seeds": []}),
            }
        )
        read = {name: list(profiles[name]) for name in prune_profiles(alone) if name in profiles}
        blocks = sorted(name for name in block_arms if name in closure)
        levels = sorted(name for name in repaired_searches if name in closure)
        keys[arm.name] = digest(
            "prune-arm", alone.key_form(), *common, read, blocks,
            *([{"repaired levels": levels}] if levels else []),
        )  # fmt: skip
    return keys


def keyed_prune(prune: PruneSpec) -> PruneSpec:
    """The prune section as its keys see it: which units write their model, in which dtype, the
    dtype it computes in (its keys hold the resolved one) and whether the recommended models are
    timed or scored as shipped (select.runtime, select.shipped:
    :func:`geospec.prune.select.key_select`) are not what a unit computes; the key holds export
    = false and the defaults, what it held before each option existed, so those prunes keep
    their keys."""
    from geospec.prune.select import key_select

    return prune.model_copy(
        update={
            "export": False,
            "export_dtype": "checkpoint",
            "compute_dtype": "float32",
            "select": key_select(prune.select),
        }
    )


def block_arms(prune: PruneSpec) -> list[str]:
    """The arms that allocate from every block linear's calibration inputs (``owl``, since it
    follows OWL's code): the key changes with what they compute, and a prune without them
    keeps its key."""
    from geospec.plugin import create_plugin

    return [
        arm.name
        for arm in prune.arms
        if getattr(create_plugin("schedule", arm.schedule), "reads_block_linears", False)
    ]


def repaired_searches(prune: PruneSpec) -> list[str]:
    """The searches (``evolve``) whose levels are repaired, their arm's repair set: their keys
    name it, so that a unit or search state of the same spec from before levels were repaired
    (a search over cut levels) is not reused; a prune without them keeps its key."""
    from geospec.kinds import ScoreAllocation
    from geospec.plugin import create_plugin

    found = []
    for arm in prune.arms:
        schedule = create_plugin("schedule", arm.schedule)
        searches = isinstance(schedule, ScoreAllocation) and schedule.reads_search
        if searches and prune.repair_of(arm) != "none":
            found.append(arm.name)
    return found


def prune_key(
    prune: PruneSpec,
    common: Sequence[object],
    profiles: Mapping[str, Sequence[float]],
    redrawn: Sequence[object],
    computed_in: Sequence[object],
) -> PruneKey:
    """The prune stage's key (:class:`PruneKey`, with each arm's own): the section as keys see
    it (:func:`keyed_prune`), the stage's ``common`` parts (the reference, data, model), the
    ``profiles`` the arms read, with ``prune.allocation_seeds`` the measure, diagnose and demand
    keys (``redrawn``), the arms that read block linears, and the dtype keys
    (``computed_in``)."""
    from geospec.storage.digests import digest

    keyed = keyed_prune(prune)
    blocks = block_arms(prune)
    levels = repaired_searches(prune)
    key = digest(
        "prune", keyed.key_form(), *common,
        {name: list(values) for name, values in sorted(profiles.items())},
        *redrawn, *([blocks] if blocks else []), *computed_in,
        *([{"repaired levels": levels}] if levels else []),
    )  # fmt: skip
    # a unit is keyed by its own arm's key: adding an arm computes only its units
    arms = arm_keys(keyed, [*common, *redrawn, *computed_in], profiles, blocks, levels)
    return PruneKey(key, arms)


def unit_key(stage_key: str, unit: Unit) -> str:
    """A unit's key: its arm's (:class:`PruneKey`; a plain stage key stands for every arm's),
    the unit's budget, arm and calibration seed."""
    from geospec.storage.digests import digest

    arms = getattr(stage_key, "arms", {})
    return digest("prune-unit", arms.get(unit.arm, stage_key), unit.keep, unit.arm, unit.seed)


def missing_exports(
    prune: PruneSpec,
    stage_key: str,
    run_dir: Path,
    dtype: str,
    recommended: Mapping[float, str] | None = None,
) -> list[Unit]:
    """The units ``prune.export`` asks a model of that have none written for their key, in
    ``dtype``; ``recommended`` (prune.json's arm per keep fraction) names what a
    ``"best@KEEP"`` entry asks for."""
    best = {keep: (recommended or {}).get(keep) for keep in prune.best_exports()}
    return [
        unit
        for unit in units_of(prune)
        if (prune.exports(unit.keep, unit.arm) or best.get(unit.keep) == unit.arm)
        and not has_model(unit.directory(run_dir), unit_key(stage_key, unit), dtype)
    ]


def recommended_arms(record: Mapping[str, Any] | None) -> dict[float, str]:
    """prune.json's recommended arm per keep fraction (none without a record or ``select``)."""
    budgets = [] if record is None else record.get("budgets", [])
    return {b["keep"]: b["recommended"]["arm"] for b in budgets if "recommended" in b}


def is_finished(prune: PruneSpec, stage_key: str, run_dir: Path, unit: Unit, dtype: str) -> bool:
    """Whether the unit's record holds its key and, when ``prune.export`` asks for its model,
    the model is written (in ``dtype``): nothing is left to do for it."""
    unit_dir, key = unit.directory(run_dir), unit_key(stage_key, unit)
    return finished_unit(unit_dir, key) is not None and (
        not prune.exports(unit.keep, unit.arm) or has_model(unit_dir, key, dtype)
    )


def chosen_units(
    prune: PruneSpec, arms: Sequence[str] | None, keep: Sequence[float] | None
) -> list[Unit]:
    """The units ``geospec prune --arms A,B --keep F,G`` computes (None: every arm, every keep
    fraction); a grid arm's name chooses every setting of its grid (:meth:`PruneSpec.
    arms_named`)."""
    names = None if arms is None else {found for name in arms for found in prune.arms_named(name)}
    return [
        unit
        for unit in units_of(prune)
        if (names is None or unit.arm in names) and (keep is None or unit.keep in keep)
    ]


def left_out_note(left_out: Sequence[Unit]) -> str:
    """What ``geospec prune --arms/--keep`` left uncomputed, by ARM@KEEP (as ``--export`` names a
    unit group) with their seeds, and how to compute them."""
    seeds: dict[str, list[int]] = {}
    for unit in left_out:
        seeds.setdefault(f"{unit.arm}@{unit.keep:g}", []).append(unit.seed)
    names = ", ".join(
        f"{name} (seed {', '.join(map(str, found))})" for name, found in seeds.items()
    )
    return (
        f"{len(left_out)} unit(s) not chosen by --arms/--keep are not computed: {names}; "
        "prune.json and the report wait for them. Run the same command without --arms and "
        "--keep to compute them (the units computed so far are reused)"
    )


def waiting_note(unit: Unit, say: Callable[[str], None]) -> Callable[[Any], None]:
    """What a prune says when another process holds ``unit``'s claim, told the holder's record
    (:func:`geospec.storage.locks.claim_holder`: None, or one without a pid, when it cannot be
    read)."""
    import socket

    def waiting(holder: dict[str, Any] | None) -> None:
        who = ""
        if holder is not None and "pid" in holder:
            host = holder["host"]  # a pid is its host's own: the host is named where it differs
            where = "" if host == socket.gethostname() else f" on {host}"
            who = f" (pid {holder['pid']}{where})"
        say(f"waiting for unit {unit.label}: another geospec prune{who} is computing it")

    return waiting


def units_of(prune: PruneSpec) -> list[Unit]:
    """Every unit of a prune, in the order they are computed (a calibration seed's units
    together: its scores are computed once)."""
    return [
        Unit(keep, arm.name, seed)
        for seed in prune.calibration.seeds
        for keep in prune.fractions
        for arm in prune.arms
    ]


def finished_unit(unit_dir: Path, key: str) -> dict[str, Any] | None:
    """A unit's stored result when it was computed from ``key`` (exported or not:
    :func:`has_model`)."""
    path = unit_dir / UNIT_FILE
    if json_problem(path, "widths", "loss", "key") is not None:
        return None
    stored = read_json(path)
    if stored.get("key") != key or seal_broken(stored):
        return None
    return dict(unsealed(stored))


def has_model(unit_dir: Path, key: str, dtype: str) -> bool:
    """Whether the unit's exported model is there, written for the unit computed from ``key``
    in ``dtype`` (``prune.export_dtype`` resolved)."""
    return written_mark(unit_dir / UNIT_MODEL_DIR) == export_mark(key, dtype)


def written_mark(model_dir: Path) -> str | None:
    """The mark of the exported model in ``model_dir`` (:func:`export_mark`: its unit's key and
    dtype), or None when no whole export is there."""
    path = model_dir / EXPORTED_FILE
    if not (model_dir / "config.json").is_file() or not path.is_file():
        return None
    return path.read_text().strip() or None


def export_mark(key: str, dtype: str) -> str:
    """What an exported model's :data:`EXPORTED_FILE` holds: the unit's key and the dtype it was
    written in (another ``export_dtype`` writes the model again)."""
    return f"{key} {dtype}"


#: In an exported model's directory: the key of the unit it was exported from, and its dtype.
EXPORTED_FILE = "geospec-unit-key"
