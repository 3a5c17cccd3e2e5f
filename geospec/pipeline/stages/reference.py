"""The reference stage: the uniform model whose activations are probed.

Either the spec's own model trained with the uniform width (``reference/``, a training directory
like any arm's), or a pretrained checkpoint that is only checked and keyed: local files by their
paths, sizes and times, a hub model by its id and commit (:mod:`geospec.hub`).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from geospec.engine.run_files import RESULT_FILE
from geospec.errors import UsageError
from geospec.hub import Source, locate
from geospec.pipeline.context import Plan, RunContext, Upstream
from geospec.pipeline.keys import data_key, digest, section, training_settings
from geospec.pipeline.run_dir import finished_model_problem
from geospec.pipeline.tracking import TrackAs
from geospec.pipeline.training import TrainingJob, train_into
from geospec.rundir.layout import REFERENCE_DIR
from geospec.spec.sections import DataSpec, ModelSpec, ReferenceSpec, Spec, TrainSpec

if TYPE_CHECKING:
    from torch import nn


@dataclass(frozen=True)
class Reference:
    name: ClassVar[str] = "reference"
    reads: ClassVar[tuple[str, ...]] = ()
    reference: ReferenceSpec
    model: ModelSpec
    data: DataSpec
    train: TrainSpec
    """Trained like the arms (with the reference's seed, and its own step count if given)."""
    study: str = ""
    """The spec's name (experiment trackers group the reference with the arms by it)."""

    @classmethod
    def from_spec(cls, spec: Spec) -> Reference:
        return cls(spec.reference, spec.model, spec.data, spec.train, spec.name)

    def key(self, spec_dir: Path) -> str:
        ref = self.reference
        if ref.checkpoint is not None:
            # dtype changes what is probed; at its default the key is the one from before it
            dtype = [] if ref.dtype == "float32" else [ref.dtype]
            source = checkpoint_source(spec_dir, ref)
            if source.on_hub:  # a commit's files never change: the id and commit are the key
                return digest("reference-hub", source.location, source.revision, *dtype)
            path = source.path
            return digest("reference-checkpoint", str(path.resolve()), _stamps(path), *dtype)
        return digest(
            "reference",
            section(self.model),
            data_key(self.data),
            section(ref),
            training_settings(self.train.model_copy(update={"seeds": [ref.seed]})),
        )

    def plan(self, run: RunContext, upstream: Upstream, forced: bool) -> Plan:
        if self.reference.checkpoint is not None:
            source = checkpoint_source(run.spec_dir, self.reference)  # a missing path: one line
            if source.on_hub:
                from geospec.hub import check_hub_files

                check_hub_files(source, "config.json")  # a wrong commit is said here, not later
            dtype = "" if self.reference.dtype == "float32" else f" in {self.reference.dtype}"
            note = f"[green]✓[/] reference: pretrained checkpoint {source}{dtype}"
            return Plan(self.key(run.spec_dir), current=True, note=note, main_only=False)
        out = run.run_dir / REFERENCE_DIR
        key = self.key(run.spec_dir)
        problem = finished_model_problem(out) if (out / RESULT_FILE).exists() else None
        return Plan(
            key,
            run=lambda: self._train(run, out, key, redo=forced or problem is not None),
            artifacts=(out / RESULT_FILE,),
            problem=problem,
            main_only=False,
        )

    def _train(self, run: RunContext, out: Path, key: str, redo: bool) -> None:
        steps = self.reference.train_steps
        budget = (
            f"{steps} steps"
            if steps
            else f"{self.train.steps} steps"
            if self.train.steps
            else f"{self.train.tokens:,} tokens"
        )
        job = TrainingJob(
            out,
            key,
            [self.model.ffn_width] * self.model.n_layers,
            self.model,
            self.train.with_steps(steps),
            run.token_data(self.data),
            self.reference.seed,
            track=TrackAs(self.study, "reference"),
        )
        trained = train_into(
            run,
            job,
            redo=redo,
            announce=f"[bold]reference[/]: training the uniform model ({budget})",
        )
        if trained is None:
            raise UsageError(
                f"{out}: another geospec process is training the reference of this run; "
                "let it finish (or stop it), then run again"
            )


#: The reference this process loaded last, by what it was loaded from (and the files' sizes and
#: times, so a reference trained again is read afresh): the probe, diagnose, demand and prune
#: stages share one copy (loading a GGUF de-quantises it for minutes). Every stage that changes
#: the model (hooks, cuts, perturbations) restores it on leaving.
_loaded: dict[tuple[object, ...], tuple[nn.Module, int]] = {}


def load_reference(run: RunContext, reference: ReferenceSpec) -> tuple[nn.Module, int]:
    """The reference model on the run's device, and its residual width: the pretrained
    checkpoint, or the run's own trained reference/; loaded once per process (until
    :func:`release_reference`)."""
    from geospec.engine.train import resolve_device

    device = resolve_device(run.device, run.dist.local_rank)  # under torchrun: this rank's GPU
    if reference.checkpoint is not None:
        source = checkpoint_source(run.spec_dir, reference)
        local = () if source.on_hub else _stamps(source.path)
        trust, dtype = reference.trust_remote_code, reference.dtype
        wanted: tuple[object, ...] = (str(source), str(device), trust, dtype, local)

        def load() -> tuple[nn.Module, int]:
            from geospec.engine.pretrained import hidden_width, load_pretrained

            model = load_pretrained(source, str(device), trust, dtype)
            return model, hidden_width(model)

    else:
        directory = run.run_dir / REFERENCE_DIR
        wanted = (str(directory), str(device), _stamps(directory))

        def load() -> tuple[nn.Module, int]:
            from geospec.engine.checkpoint import load_model

            trained = load_model(directory).to(device).eval()
            return trained, trained.config.d_model

    if wanted not in _loaded:
        _loaded.clear()  # one at a time: a run has one reference
        # seconds to minutes (a GGUF file is de-quantized): said, not silent
        run.say(f"reference: loading {wanted[0]} on {device}")
        _loaded[wanted] = load()
    return _loaded[wanted]


def release_reference() -> None:
    """Forget the loaded reference (its memory is needed: training comes next)."""
    _loaded.clear()


def checkpoint_source(spec_dir: Path, reference: ReferenceSpec) -> Source:
    """Where the pretrained checkpoint is read from: a hub id at its commit, or a local directory
    or .gguf file (relative paths are relative to the spec file, like every path in a spec)."""
    assert reference.checkpoint is not None
    return locate(reference.checkpoint, reference.revision, spec_dir, "reference.checkpoint")


def _stamps(path: Path) -> tuple[tuple[str, int, int], ...]:
    """Each file of a local checkpoint (the file, or a directory's files): path, size, mtime."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files)


def compute_dtype(run: RunContext, requested: str, reference: ReferenceSpec, field: str) -> str:
    """The dtype a stage's forward passes on the reference compute in (``requested``, a
    ``compute_dtype`` value, resolved for the run's device and the dtype the reference is
    loaded in: :func:`geospec.hardware.resolve_compute_dtype`); a warning is said once."""
    from geospec.engine.train import resolve_device
    from geospec.hardware import resolve_compute_dtype

    device = resolve_device(run.device, run.dist.local_rank)
    dtype, warning = resolve_compute_dtype(requested, device.type, loaded_dtype(reference), field)
    if warning is not None and warning not in _warned:
        _warned.add(warning)
        run.say(f"[yellow]![/] {warning}")
    return dtype


def reference_computing(run: RunContext, dtype: str) -> AbstractContextManager[None]:
    """Forward passes on the reference computing in ``dtype`` (what :func:`compute_dtype`
    resolved) on this rank's device: the diagnose and demand stages' measurements."""
    from geospec.engine.precision import computing
    from geospec.engine.train import resolve_device

    return computing(dtype, resolve_device(run.device, run.dist.local_rank))


def loaded_dtype(reference: ReferenceSpec) -> str:
    """The dtype the reference's weights are loaded in: reference.dtype for a checkpoint, float32
    for the run's own trained reference."""
    return reference.dtype if reference.checkpoint is not None else "float32"


def dtype_key(dtype: str, reference: ReferenceSpec) -> list[dict[str, str]]:
    """A stage key's part for its compute dtype: empty where the stage computes in the dtype its
    weights are loaded in (what every stage computed before compute_dtype existed, so those
    keys are unchanged), else the dtype it autocasts to."""
    return [] if dtype == loaded_dtype(reference) else [{"compute_dtype": dtype}]


_warned: set[str] = set()
