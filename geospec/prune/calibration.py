"""Each calibration sample's work, computed once per seed and only when a unit needs it, and
shared by that seed's units: the neuron scores (:func:`geospec.prune.score.calibrated`), the
least-squares re-fit's windows and moments, and from them how a unit's arm cuts and repairs
(:class:`geospec.prune.cut.Cut`) and the levels its search visits."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from geospec.prune.cut import Cut, load_cut, save_cut
from geospec.prune.score import Scored, calibrated, progress_lines
from geospec.prune.units import Unit
from geospec.prune.units import unit_key as key_of
from geospec.rundir.layout import CUT_FILE, REPAIR_FILE

if TYPE_CHECKING:
    import numpy as np
    import torch
    from torch import nn

    from geospec.kinds import Importance
    from geospec.measure.probe import FFNSite
    from geospec.measure.sensitivity import Batch
    from geospec.prune.repair import Moments, Refit
    from geospec.prune.search import RepairedLevels
    from geospec.spec.sections import PruneSpec


class Calibration:
    """The calibration samples of one prune: ``importances`` by their key
    (:func:`geospec.prune.score.importance_key`), ``arm_importance`` each arm's key among them;
    ``compensate``, ``blocks`` and ``batches`` say what the scores' pass records besides
    (:func:`~geospec.prune.score.calibrated`). A unit's least-squares repair is kept in its
    directory under ``run_dir``, sealed with its key (from ``stage_key``)."""

    def __init__(
        self,
        model: nn.Module,
        sites: Sequence[FFNSite],
        prune: PruneSpec,
        importances: Mapping[str, Importance],
        arm_importance: Mapping[str, str],
        train_tokens: np.ndarray,
        seq_len: int,
        bos: int | None,
        run_dir: Path,
        stage_key: str,
        say: Callable[[str], None],
        *,
        compensate: bool,
        blocks: bool,
        batches: bool,
    ) -> None:
        self.model, self.sites, self.prune = model, sites, prune
        self.importances, self.arm_importance = importances, arm_importance
        self.train_tokens, self.seq_len, self.bos = train_tokens, seq_len, bos
        self.run_dir, self.stage_key, self.say = run_dir, stage_key, say
        self.compensate, self.blocks, self.batches = compensate, blocks, batches
        self.kinds = ", ".join(sorted({i.kind_name() for i in importances.values()}))
        """The importances' kinds, for the lines that say what is scored."""
        self._scored: dict[int, Scored] = {}  # by calibration seed
        # the re-fit's calibration windows and their moments, by seed and window count; the
        # moments of one sample at a time (n x n float64 per layer)
        self._repair_batches: dict[tuple[int, int], list[Batch]] = {}
        self._moments: dict[tuple[int, int], list[Moments]] = {}

    def scored(self, seed: int) -> Scored:
        """Calibration sample ``seed``'s scores, computed once and only when needed."""
        if seed not in self._scored:
            prune = self.prune
            self.say(f"prune: calibration sample {seed}: {self.kinds} scores on "
                     f"{prune.calibration.windows} windows of {self.seq_len} tokens")  # fmt: skip
            self._scored[seed] = calibrated(
                self.model, self.sites, self.importances, self.train_tokens, self.seq_len,
                prune, seed, compensate=self.compensate, blocks=self.blocks,
                batches=self.batches, bos=self.bos, say=self.say,
            )  # fmt: skip
        return self._scored[seed]

    def orders(self, arm: str, seed: int) -> list[list[int]]:
        """Every layer's neuron order under arm ``arm``'s importance, from sample ``seed``."""
        return self.scored(seed).orders[self.arm_importance[arm]]

    def repair_inputs(self, seed: int, windows: int) -> list[Batch]:
        """The re-fit's ``windows`` calibration windows of sample ``seed``, as model inputs."""
        from geospec.prune.repair import window_batches
        from geospec.prune.score import calibration_windows

        if (seed, windows) not in self._repair_batches:
            starts = calibration_windows(self.train_tokens, self.seq_len, windows, seed)
            device = next(self.model.parameters()).device
            self._repair_batches[(seed, windows)] = window_batches(
                self.train_tokens, starts, self.seq_len, self.prune.calibration.batch_size,
                device, self.bos,
            )  # fmt: skip
        return self._repair_batches[(seed, windows)]

    def moments(self, seed: int, windows: int) -> list[Moments]:
        """Every layer's moments on those windows (the scores' own where they read them)."""
        from geospec.prune.repair import calibration_moments

        same = self.scored(seed).moments  # the scores' pass over the same windows (obs)
        if same is not None and windows == self.prune.calibration.windows:
            return same
        if (seed, windows) not in self._moments:
            self._moments.clear()
            self.say(f"prune: calibration moments of seed {seed} for the least-squares repair "
                     f"({windows} windows)")  # fmt: skip
            batches = self.repair_inputs(seed, windows)
            lines = progress_lines(self.say, f"moments of seed {seed}", batches)
            self._moments[(seed, windows)] = calibration_moments(
                self.model, self.sites, batches, advance=lines
            )
        return self._moments[(seed, windows)]

    def cut(self, unit: Unit, widths: Sequence[int]) -> Cut:
        """How ``unit``'s arm cuts at ``widths`` (:class:`~geospec.prune.cut.Cut`): its orders
        (and means) and its least-squares repair each read from the unit's records, or computed
        and recorded (the calibration sample scored only where a record is missing)."""
        from geospec.prune.repair import one_pass_refits, sequential_refits, unit_refits

        prune = self.prune
        arm = next(a for a in prune.arms if a.name == unit.arm)
        mean = prune.compensates(arm)
        orders, means = self.unit_orders(unit, mean)
        if mean:
            return Cut(orders, means=means)
        if not prune.refits(arm):
            return Cut(orders)
        lstsq = prune.lstsq_of(arm)
        windows = lstsq.windows or prune.calibration.windows

        def compute() -> list[Refit | None]:
            settings = (lstsq.damping, lstsq.intercept)
            if lstsq.inputs == "sequential":
                batches = self.repair_inputs(unit.seed, windows)
                return sequential_refits(self.model, self.sites, batches, orders, widths, *settings)
            found = self.moments(unit.seed, windows)
            return one_pass_refits(self.sites, found, orders, widths, *settings)

        path = unit.directory(self.run_dir) / REPAIR_FILE
        key = key_of(self.stage_key, unit)
        refits = unit_refits(path, key, len(self.sites), compute, self.say)
        return Cut(orders, refits=refits)

    def unit_orders(
        self, unit: Unit, mean: bool
    ) -> tuple[list[list[int]], list[torch.Tensor] | None]:
        """Every layer's neuron order under ``unit``'s arm's importance and, with ``mean`` (the
        arm mean-compensated), the means: from the unit's ``cut.safetensors`` when it holds the
        unit's key (a unit recorded before the file existed, or a damaged file, named, is scored
        again), else from its calibration sample's scores, and recorded."""
        from geospec.measure.cut import ffn_width

        path = unit.directory(self.run_dir) / CUT_FILE
        key = key_of(self.stage_key, unit)
        stored, problem = load_cut(path, key, [ffn_width(site.ffn) for site in self.sites])
        if stored is not None and (stored.means is not None) == mean:
            return stored.orders, stored.means
        if problem is not None:
            self.say(f"prune: {problem}; the unit's neuron orders are computed again")
        work = self.scored(unit.seed)
        cut = Cut(work.orders[self.arm_importance[unit.arm]], means=work.means if mean else None)
        save_cut(path, key, cut)
        return cut.orders, cut.means

    def levels(self, name: str, seed: int) -> RepairedLevels | None:
        """The levels arm ``name``'s search visits, repaired as the arm repairs (None: cut),
        from calibration sample ``seed`` and the unpruned model's inputs (for the
        least-squares repair, one pass whatever ``inputs`` its winner is repaired from)."""
        from geospec.prune.search import RepairedLevels

        prune = self.prune
        arm = next(a for a in prune.arms if a.name == name)
        orders = self.orders(name, seed)
        if prune.compensates(arm):
            return RepairedLevels(self.sites, orders, means=self.scored(seed).means)
        if not prune.refits(arm):
            return None
        lstsq = prune.lstsq_of(arm)
        found = self.moments(seed, lstsq.windows or prune.calibration.windows)
        return RepairedLevels(
            self.sites, orders, moments=found, damping=lstsq.damping, intercept=lstsq.intercept
        )
