"""Every name in a run directory, in one place below everything that writes or reads one
(torch-free; docs/pipeline.md's layout).

``spec.resolved.toml``, ``plugins.json``, ``env.json``, ``run.json``, ``stages.json``,
``reference/``, ``clouds/`` (one file per probed layer, ``meta.json``), ``profiles.json``,
``measures.json``, ``diagnostics.json``, ``demand.json``, ``widths.json``, ``prune.json`` and
``prune/keep-<f>/<arm>/seed-<k>/`` (one unit each: ``result.json``, ``model/``, ``heal/``),
``prune/keep-<f>/shipped.json`` (what the recommended model there ships as),
``arms/<arm>/seed-<k>/`` (one training directory each: ``run_key.json``, ``failure.json``,
``eval.json`` beside the trainer's files), ``launch/submitted.json``, ``results.json``,
``report.md``, ``plots/``.
"""

from __future__ import annotations

from pathlib import Path

STAGES_FILE = "stages.json"
RUN_FILE = "run.json"
REFERENCE_DIR = "reference"
CLOUDS_DIR = "clouds"
PROFILES_FILE = "profiles.json"
MEASURES_FILE = "measures.json"
DIAGNOSTICS_FILE = "diagnostics.json"
DEMAND_FILE = "demand.json"
PRUNE_FILE = "prune.json"
PRUNE_DIR = "prune"
WIDTHS_FILE = "widths.json"
RESULTS_FILE = "results.json"
REPORT_FILE = "report.md"
RUN_KEY_FILE = "run_key.json"
FAILURE_FILE = "failure.json"
EVAL_FILE = "eval.json"
SUBMITTED_FILE = "launch/submitted.json"
#: The probe's record of what it probed, in ``clouds/``.
PROBE_META_FILE = "meta.json"
#: A prune unit's record, its exported model and its healing's training directory.
UNIT_FILE = "result.json"
UNIT_MODEL_DIR = "model"
HEAL_DIR = "heal"
#: ``geospec heal``'s healing of a unit's exported model, in the unit's directory: its record
#: (``result.json``), training directory and healed model (``model/``).
HEALED_DIR = "healed"
HEALED_TRAIN_DIR = "train"
#: A search allocation's (``evolve``) resumable state, in its unit's directory.
SEARCH_FILE = "search.json"
#: A unit's least-squares repair (``prune.repair = "lstsq"``): its re-fitted output projections.
REPAIR_FILE = "repair.safetensors"
#: How a unit's arm cut it (every layer's neuron order, a mean compensation's means), so that its
#: model is written again without its calibration sample scored again.
CUT_FILE = "cut.safetensors"
#: What a keep fraction's recommended model ships as (its files' sizes, its llama.cpp speed), in
#: the keep fraction's directory.
SHIPPED_FILE = "shipped.json"
#: A prune unit's GGUF file scored on the selection windows (prune.select.shipped), in its
#: directory.
SHIPPED_LOSS_FILE = "shipped_loss.json"


def arm_seed_dir(run_dir: Path, arm: str, seed: int) -> Path:
    """The training directory of one arm and seed."""
    return run_dir / "arms" / arm / f"seed-{seed}"


def prune_keep_dir(run_dir: Path, keep: float) -> Path:
    """The directory of one keep fraction's units (and its recommended model's record)."""
    return run_dir / PRUNE_DIR / f"keep-{keep:g}"


def prune_unit_dir(run_dir: Path, keep: float, arm: str, seed: int) -> Path:
    """The directory of one prune unit: ``keep`` of the FFN neurons, ``arm``'s allocation,
    calibration sample ``seed``."""
    return prune_keep_dir(run_dir, keep) / arm / f"seed-{seed}"
