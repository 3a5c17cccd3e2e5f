"""The reference stage: the uniform model whose activations are probed.

Either the spec's own model trained with the uniform width (``reference/``, a training directory
like any arm's), or a pretrained checkpoint that is only checked and keyed by its files.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from geospec.engine.run_files import RESULT_FILE
from geospec.errors import UsageError
from geospec.pipeline.context import Done, Plan, RunContext
from geospec.pipeline.keys import data_key, digest, section, training_settings
from geospec.pipeline.run_dir import REFERENCE_DIR, finished_model_problem
from geospec.pipeline.training import train_into
from geospec.spec.sections import DataSpec, ModelSpec, ReferenceSpec, Spec, TrainSpec

if TYPE_CHECKING:
    from torch import nn


@dataclass(frozen=True)
class Reference:
    name: ClassVar[str] = "reference"
    reference: ReferenceSpec
    model: ModelSpec
    data: DataSpec
    train: TrainSpec
    """Trained like the arms (with the reference's seed, and its own step count if given)."""

    @classmethod
    def from_spec(cls, spec: Spec) -> Reference:
        return cls(spec.reference, spec.model, spec.data, spec.train)

    def key(self, spec_dir: Path) -> str:
        ref = self.reference
        if ref.checkpoint is not None:
            path = checkpoint_path(spec_dir, ref.checkpoint)
            stamp = [(str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in _files(path)]
            return digest("reference-checkpoint", str(path.resolve()), stamp)
        return digest(
            "reference",
            section(self.model),
            data_key(self.data),
            section(ref),
            training_settings(self.train.model_copy(update={"seeds": [ref.seed]})),
        )

    def plan(self, run: RunContext, done: Mapping[str, Done], forced: bool) -> Plan:
        checkpoint = self.reference.checkpoint
        if checkpoint is not None:
            path = checkpoint_path(run.spec_dir, checkpoint)
            if not path.exists():
                raise UsageError(
                    f"reference.checkpoint: {path} does not exist; give a local Hugging Face "
                    "model directory or .gguf file (relative paths are relative to the spec file)"
                )
            note = f"[green]✓[/] reference: pretrained checkpoint {path}"
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
        trained = train_into(
            run,
            out,
            key,
            [self.model.ffn_width] * self.model.n_layers,
            model=self.model,
            train=self.train,
            data=run.token_data(self.data),
            seed=self.reference.seed,
            steps=steps,
            redo=redo,
            announce=f"[bold]reference[/]: training the uniform model ({budget})",
        )
        if trained is None:
            raise UsageError(
                f"{out}: another geospec process is training the reference of this run; "
                "let it finish (or stop it), then run again"
            )


def load_reference(run: RunContext, reference: ReferenceSpec) -> tuple[nn.Module, int]:
    """The reference model on the run's device, and its residual width."""
    from geospec.engine.train import resolve_device

    device = resolve_device(run.device)
    checkpoint = reference.checkpoint
    if checkpoint is not None:
        from geospec.engine.pretrained import hidden_width, load_pretrained

        model = load_pretrained(
            checkpoint_path(run.spec_dir, checkpoint), str(device), reference.trust_remote_code
        )
        return model, hidden_width(model)
    from geospec.engine.checkpoint import load_model

    model = load_model(run.run_dir / REFERENCE_DIR).to(device).eval()
    return model, model.config.d_model


def checkpoint_path(spec_dir: Path, checkpoint: str) -> Path:
    """A pretrained checkpoint's path; relative paths are relative to the spec file, like every
    other path in a spec."""
    path = Path(checkpoint).expanduser()
    return path if path.is_absolute() else spec_dir / path


def _files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else []
