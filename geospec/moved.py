"""Names that moved: the old import path keeps working, with a warning naming the new one.

Every module that used to hold public names (shown to users in an earlier README or docs page,
or a top-level module packaged since) and holds nothing else now is a row of
:data:`OLD_MODULES`, not a file: ``import geospec``
installs :class:`OldHomes`, which builds such a module when it is imported, so that ``from
geospec.train import train_model`` still works after the engine moved to
``geospec.engine.train``. The name is imported from its new home on first use (keeping torch out
of ``import geospec.<old>``) and the warning says where to import it from. A module that still
holds code of its own (``geospec.data``, ``geospec.pipeline.run_dir``) sets its module-level
``__getattr__`` with :func:`moved_names`. Shims stay for at least one minor version
(CHANGELOG.md lists them).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

#: The release in which the shims were added, and the earliest one that may remove them.
DEPRECATED_IN = "0.2.0"
REMOVED_IN = "0.3.0"


def _all_to(home: str, names: str) -> dict[str, str]:
    """Each of the space-separated ``names``, moved to ``home``."""
    return dict.fromkeys(names.split(), home)


#: The modules that hold only moved names: each name and the module it lives in now.
OLD_MODULES: dict[str, dict[str, str]] = {
    # 0.1.0's documented homes
    "geospec.specfile": _all_to("geospec.spec", "validate_spec load_spec"),
    "geospec.widths": {
        **_all_to("geospec.solve.widths", "compute_widths write_widths"),
        "read_profiles": "geospec.profiles",
    },
    "geospec.train": _all_to("geospec.engine.train", "train_model load_model"),
    "geospec.model": _all_to("geospec.engine.model", "GPT GPTConfig config_from_spec"),
    "geospec.sensitivity": _all_to(
        "geospec.measure.sensitivity",
        "loss_batches layer_sensitivity additivity sample_pairs mean_loss scaled_sublayers "
        "next_token_loss",
    ),
    "geospec.intrinsic_dimension": _all_to(
        "geospec.measure.intrinsic_dimension", "two_nn fit_two_nn"
    ),
    # 0.2.0's homes, moved down a floor (docs/architecture.md, "Packages in layers")
    "geospec.engine.model_size": _all_to(
        "geospec.shapes.model_size",
        "Shape kv_width kv_head_problems attention_problems ffn_params norm_params "
        "attention_params count_params total_ffn_params",
    ),
    "geospec.solve.profiles": _all_to(
        "geospec.profiles",
        "PROFILES_KEY MAX_PROFILES_BYTES check_profile resample_profile read_profiles",
    ),
    # 0.2.0's top-level modules, packaged (docs/architecture.md, "Who owns what"): safe files on
    # disk in `storage`, the run directory's names and records in `rundir`
    "geospec.atomic": _all_to(
        "geospec.storage.atomic",
        "atomic_path atomic_open atomic_write_text atomic_write_json check_new_directory "
        "atomic_directory",
    ),
    "geospec.disk": _all_to(
        "geospec.storage.disk",
        "FULL FULL_WORDS NEARLY_FULL free_bytes says_full out_of_space unplaced_out_of_space "
        "writing size",
    ),
    "geospec.locks": _all_to(
        "geospec.storage.locks",
        "file_lock claim_path claim holder_record claim_holder holder_alive",
    ),
    "geospec.digests": _all_to(
        "geospec.storage.digests",
        "digest file_digest SEAL json_digest unsealed sealed seal_broken",
    ),
    "geospec.layout": _all_to(
        "geospec.rundir.layout",
        "STAGES_FILE RUN_FILE REFERENCE_DIR CLOUDS_DIR PROFILES_FILE MEASURES_FILE "
        "DIAGNOSTICS_FILE DEMAND_FILE PRUNE_FILE PRUNE_DIR WIDTHS_FILE RESULTS_FILE REPORT_FILE "
        "RUN_KEY_FILE FAILURE_FILE EVAL_FILE SUBMITTED_FILE PROBE_META_FILE UNIT_FILE "
        "UNIT_MODEL_DIR HEAL_DIR HEALED_DIR HEALED_TRAIN_DIR SEARCH_FILE REPAIR_FILE SHIPPED_FILE "
        "SHIPPED_LOSS_FILE arm_seed_dir prune_keep_dir prune_unit_dir",
    ),
    "geospec.artifacts": _all_to(
        "geospec.rundir.artifacts", "read_json read_json_or_none json_problem"
    ),
    "geospec.records": _all_to(
        "geospec.rundir.records",
        "PROBE_ONLY_TRAIN_KEY MEASURED_KEYS DIAGNOSTICS_KEYS DEMAND_KEYS PRUNE_KEYS "
        "read_diagnostics read_demand read_prune StageLog stored_run_key trains_nothing",
    ),
    # 0.2.0's prune/apply.py, split by what each step does (issue 57; docs/architecture.md)
    "geospec.prune.apply": {
        **_all_to("geospec.prune.score", "calibration_windows neuron_scores"),
        "pruned": "geospec.prune.cut",
        **_all_to("geospec.prune.losses", "eval_loss window_losses ffn_parameters"),
        **_all_to(
            "geospec.prune.hf_export",
            "export_pruned compensated_export_problem compensation_biases",
        ),
        **_all_to("geospec.measure.calibration", "calibration_stats calibrate"),
    },
}


def moved_names(old_module: str, new_homes: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``old_module`` whose names now live in ``new_homes[name]``."""

    def __getattr__(name: str) -> Any:
        new_module = new_homes.get(name)
        if new_module is None:
            raise AttributeError(f"module {old_module!r} has no attribute {name!r}")
        warnings.warn(
            f"{old_module}.{name} moved to {new_module}.{name} in geospec {DEPRECATED_IN}; "
            f"import it from there (the old path goes in {REMOVED_IN})",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(new_module), name)

    return __getattr__


class OldHomes(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """The import system's finder and loader of the modules in :data:`OLD_MODULES`."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        return importlib.util.spec_from_loader(fullname, self) if fullname in OLD_MODULES else None

    def create_module(self, spec: ModuleSpec) -> None:
        return None  # the default module

    def exec_module(self, module: ModuleType) -> None:
        new_homes = OLD_MODULES[module.__name__]
        homes = ", ".join(f"`{home}`" for home in sorted(set(new_homes.values())))
        module.__doc__ = f"Deprecated since {DEPRECATED_IN}: its names moved to {homes}."
        module.__getattr__ = moved_names(module.__name__, new_homes)  # type: ignore[method-assign]


def install_old_homes() -> None:
    """Make the modules of :data:`OLD_MODULES` importable (once per process)."""
    if not any(isinstance(finder, OldHomes) for finder in sys.meta_path):
        sys.meta_path.append(OldHomes())
