"""The kinds of plugin and the contract each one fulfils, with the helpers plugins use.

Nothing here imports torch: these classes are only the shapes that the core (validation,
registries) and the pipeline (measure, solve, train) rely on. Concrete plugins live in
``geospec_plugins`` or in third-party packages and do their heavy imports inside their methods.

With :mod:`geospec.plugin` (the base classes, ``Register`` and plugin-table fields) and
:mod:`geospec.errors`, this module is the whole API a plugin imports: the builtins use nothing
else. Allocations from neuron scores are schedules of their own shape,
:class:`ScoreAllocation` (told apart by :func:`reads_scores`). Helpers for schedules and solvers
are re-exported here: :func:`round_to_budget`, :func:`units_between` and
:class:`InfeasibleBudget` (exact-budget rounding), :func:`check_profile` and
:func:`resample_profile` (profile checks and depth resampling).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

from geospec.errors import UsageError
from geospec.plugin_base import Plugin
from geospec.profiles import check_profile, resample_profile
from geospec.rounding import InfeasibleBudget, round_to_budget, units_between

if TYPE_CHECKING:
    import torch


class Geometry(Plugin):
    """How distances between token states are measured.

    ``prepare`` maps a cloud (n x d tensor) to what the distances need (for example unit vectors
    scaled into the Poincaré ball); ``pairwise`` gives the n x n distance matrix of a prepared
    cloud;
    ``paired`` the n distances between corresponding rows of two prepared clouds.
    """

    register_hook: ClassVar[str] = "geospec_register_geometries"
    """The hook that registers plugins of this kind."""
    #: Whether a global rescaling of both clouds changes the distances (True for ``raw``).
    scale_sensitive: ClassVar[bool] = False
    #: Whether ``pairwise`` computes on the device of the points it is given (plain torch, no
    #: numpy). On a run whose device is a GPU the measurement then hands it the prepared points
    #: in float32 on that GPU and the statistics receive the matrix back in float64 on the CPU,
    #: as always (True for the builtins; docs/engine.md bounds the difference). False: it gets
    #: the float64 CPU points ``prepare`` gave, on any run.
    pairwise_on_device: ClassVar[bool] = False

    def prepare(self, cloud: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def pairwise(self, points: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def paired(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class Statistic(Plugin):
    """A work statistic: how much an FFN moved cloud ``x`` (before) to cloud ``y`` (after).

    ``__call__(geometry, x, y)`` receives raw clouds (n x d, same n, same token order) and returns
    a non-negative float. It must be vectorised (no Python loops over tokens).
    """

    register_hook: ClassVar[str] = "geospec_register_statistics"
    """The hook that registers plugins of this kind."""

    def __call__(self, geometry: Geometry, x: torch.Tensor, y: torch.Tensor) -> float:
        raise NotImplementedError


class Smoother(Plugin):
    """Maps a work profile (one float per layer) to a smoothed profile of the same length."""

    register_hook: ClassVar[str] = "geospec_register_smoothers"
    """The hook that registers plugins of this kind."""

    def __call__(self, profile: Sequence[float]) -> list[float]:
        raise NotImplementedError


@dataclass(frozen=True)
class WidthProblem:
    """What a solver is asked: integer widths for ``work`` summing exactly to ``budget``.

    ``work`` holds one non-negative work value per layer (the smoothed, resampled profile).
    ``lower``/``upper`` are the hard limits on each width set by the caller (schedules pass one
    rounding multiple and the whole budget); a solver may narrow them further with its own
    parameters (``power_law`` and ``proportional`` take ``min_ratio``/``max_ratio`` of the uniform
    width), but never widen them. Every width is a multiple of ``multiple``.
    ``exponents`` (a_l) and ``sensitivities`` (lambda_l) are per-layer, or None for the defaults
    (the solver's shared exponent, and lambda_l = 1).
    """

    work: tuple[float, ...]
    budget: int
    multiple: int
    lower: int
    upper: int
    exponents: tuple[float, ...] | None = None
    sensitivities: tuple[float, ...] | None = None

    @property
    def n_layers(self) -> int:
        return len(self.work)

    @property
    def uniform_width(self) -> float:
        """The width every layer would get under the uniform schedule (``budget / n_layers``)."""
        return self.budget / len(self.work)


class Solver(Plugin):
    """Turns a work profile into integer widths with an exact budget (see :class:`WidthProblem`)."""

    register_hook: ClassVar[str] = "geospec_register_solvers"
    """The hook that registers plugins of this kind."""

    def solve(self, problem: WidthProblem) -> list[int]:
        raise NotImplementedError

    def bounds(self, problem: WidthProblem) -> tuple[int, int] | None:
        """The smallest and largest width this solver may give a layer of ``problem`` when its own
        params set them (``min_ratio``/``max_ratio`` of the builtin solvers, within the hard
        limits), or None when it sets none. Every width :meth:`solve` returns lies inside them
        (checked); reports mark the layers that sit at one, where the bound, not the profile,
        may have set the width."""
        return None

    def check(self, dims: ModelDims) -> list[str]:
        """Problems with these params for this model (for example bounds that cannot meet the
        budget); schedules holding a solver report them from :meth:`Schedule.check`."""
        return []


@dataclass(frozen=True)
class ModelDims:
    """What a schedule needs to know about the target model."""

    n_layers: int
    d_model: int
    ffn_width: int
    """The uniform FFN width; every schedule keeps :attr:`budget` exactly (``n_layers *
    ffn_width`` for a whole model)."""
    multiple_of: int
    activation: str = "gelu"
    max_width: int | None = None
    """The widest a layer may be (None: the whole budget). Pruning sets it to the pretrained
    width, which no layer may exceed; solvers receive it as the hard upper limit."""
    total_width: int | None = None
    """The exact sum of the widths when it is not ``n_layers * ffn_width`` (None: it is). Only a
    part of a model has one (:meth:`part`: the unprotected layers of ``protect``), whose share of
    the budget need not be a whole number of widths per layer."""

    @property
    def budget(self) -> int:
        """What the widths sum to exactly: ``n_layers * ffn_width``, or ``total_width``."""
        return self.n_layers * self.ffn_width if self.total_width is None else self.total_width

    @property
    def uniform_width(self) -> float:
        """The width every layer would get under the uniform schedule (``budget / n_layers``):
        ``ffn_width`` for a whole model, not always a whole number for a part of one."""
        return self.budget / self.n_layers

    def part(self, n_layers: int, budget: int) -> ModelDims:
        """``n_layers`` of this model's layers sharing exactly ``budget`` (the same d_model,
        multiple, activation and ``max_width``), as a model of their own: what ``protect`` hands
        the schedule of its unprotected layers. Its ``ffn_width`` is the share rounded down; a
        schedule reads the share itself as :attr:`uniform_width` and sums to :attr:`budget`."""
        if n_layers < 1 or budget < 0:
            raise ValueError(f"a part of a model has layers and a budget, not {n_layers}, {budget}")
        share = budget // n_layers
        exact = None if share * n_layers == budget else budget
        return ModelDims(
            n_layers,
            self.d_model,
            share,
            self.multiple_of,
            self.activation,
            self.max_width,
            total_width=exact,
        )

    def width_problem(
        self,
        work: Sequence[float],
        exponents: Sequence[float] | None = None,
        sensitivities: Sequence[float] | None = None,
    ) -> WidthProblem:
        """The solver problem for this model: the exact budget, the model's rounding multiple and
        the hard limits every width has (at least one multiple, at most the whole budget or
        ``max_width``)."""
        return WidthProblem(
            work=tuple(float(w) for w in work),
            budget=self.budget,
            multiple=self.multiple_of,
            lower=self.multiple_of,
            upper=self.budget if self.max_width is None else min(self.budget, self.max_width),
            exponents=None if exponents is None else tuple(float(a) for a in exponents),
            sensitivities=None if sensitivities is None else tuple(float(s) for s in sensitivities),
        )


class Schedule(Plugin):
    """Produces one integer FFN width per layer whose sum is exactly ``dims.budget``.

    ``profiles`` maps profile names ("topology/hyperbolic") to per-layer work measured on the
    reference model; schedules that need none ignore it.

    What a schedule reads is declared by three methods: :meth:`required_profiles` (measured
    profiles), :meth:`profiles_file` (another run's profiles instead) and :meth:`required_arms`
    (other arms' widths). A schedule built from other arms' widths (``fitted``, ``sorted``) names
    those arms in :meth:`required_arms` and implements :meth:`widths_from`, which receives their
    widths; the core computes the arms it names first and calls :meth:`widths_from` for every
    schedule. A schedule that reads the neuron scores of a model being pruned is a
    :class:`ScoreAllocation` instead.
    """

    register_hook: ClassVar[str] = "geospec_register_schedules"
    """The hook that registers plugins of this kind."""
    #: Deprecated (subclass :class:`ScoreAllocation` instead; :func:`reads_scores` tells): whether
    #: the widths come from every neuron's importance score (:meth:`widths_from_scores`). A
    #: plugin class that still sets it gets a DeprecationWarning and keeps working.
    reads_neuron_scores: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # Only the contracts of this module may set the old flag (ScoreAllocation keeps it true
        # for callers that still read it); a plugin that sets it is told what replaces it.
        if "reads_neuron_scores" in cls.__dict__ and cls.__module__ != __name__:
            warnings.warn(
                f"{cls.__module__}.{cls.__qualname__} sets Schedule.reads_neuron_scores, which is "
                "deprecated and goes in 0.3.0: subclass geospec.kinds.ScoreAllocation instead "
                "(its one method is widths_from_scores)",
                DeprecationWarning,
                stacklevel=2,
            )

    def widths_from_scores(self, dims: ModelDims, scores: Sequence[Sequence[float]]) -> list[int]:
        """The widths given ``scores[l][i]``, the importance of neuron i of layer l of the model
        being pruned (higher: kept longer): :meth:`ScoreAllocation.widths_from_scores` (kept
        here for a plugin that sets the deprecated :attr:`reads_neuron_scores`)."""
        raise NotImplementedError

    def required_profiles(self) -> list[str]:
        """Names of the measured profiles this schedule reads (checked against ``measure``)."""
        return []

    def profiles_file(self) -> str | None:
        """A profiles file (another run's profiles.json) whose profiles this schedule reads
        instead of the run's own measurements, or None. The core reads it (the arm is pending
        while it does not exist) and accepts its profiles at any depth: the schedule resamples
        them to the model's (the depth-transfer option)."""
        return None

    def required_arms(self) -> list[str]:
        """Names of the other arms whose widths this schedule reads (checked: each exists, and no
        arms depend on each other in a cycle); their widths reach :meth:`widths_from`."""
        return []

    def check(self, dims: ModelDims) -> list[str]:
        """Problems with these params for this model (for example a width list of wrong length)."""
        return []

    def widths(self, dims: ModelDims, profiles: Mapping[str, Sequence[float]]) -> list[int]:
        raise NotImplementedError

    def widths_from(
        self,
        dims: ModelDims,
        profiles: Mapping[str, Sequence[float]],
        arms: Mapping[str, Sequence[int]],
    ) -> list[int]:
        """The widths given the profiles and ``arms``, the widths of each arm named by
        :meth:`required_arms` (what the core calls). By default ``widths(dims, profiles)``: a
        schedule that reads no arm implements :meth:`widths` only."""
        return self.widths(dims, profiles)

    def bounds(self, dims: ModelDims) -> tuple[int, int] | None:
        """The smallest and largest width this schedule may give a layer of this model when a
        param sets them (a solver's bounds: :meth:`Solver.bounds`), or None when none does (a
        fixed taper, a manual list). Every width it returns lies inside them (the core checks);
        ``widths.json`` records them and reports mark the layers that sit at one."""
        return None

    def bounds_from(
        self, dims: ModelDims, arms: Mapping[str, tuple[int, int] | None]
    ) -> tuple[int, int] | None:
        """The bounds given ``arms``, the bounds of each arm named by :meth:`required_arms` (what
        the core calls; a ``sorted`` arm has its source's). By default ``bounds(dims)``."""
        return self.bounds(dims)


class ScoreAllocation(Schedule):
    """A schedule whose widths come from every neuron's importance score of the model being
    pruned (the pruning allocations ``flap`` and ``owl``), not from per-layer profiles: it serves
    ``geospec prune`` only, where the scores exist, and is registered as a schedule (a
    ``[[prune.arms]]`` table names it by ``kind`` like any other).

    Its one method is :meth:`widths_from_scores`; :meth:`widths` refuses with one line (a
    training arm has no neuron scores: ``geospec validate`` says so first). It reads no profiles
    and no other arm unless it overrides those methods.
    """

    #: Still true for callers of the deprecated flag (:func:`reads_scores` is the test now).
    reads_neuron_scores: ClassVar[bool] = True
    #: Whether the widths also read every linear map of every decoder block with its
    #: calibration input statistics (:class:`BlockLinears`: OWL's per-weight Wanda scores);
    #: the core then calls :meth:`widths_from_blocks` instead of :meth:`widths_from_scores`, and
    #: runs that calibration only for an arm whose allocation sets it.
    reads_block_linears: ClassVar[bool] = False
    #: Whether the widths come from a search on the calibration loss (:class:`CutLosses`); the
    #: core then calls :meth:`widths_from_losses` with the losses of the arm's own cuts.
    reads_cut_losses: ClassVar[bool] = False
    #: Whether the widths come from a search that scores whole allocations (:class:`Search`:
    #: ``evolve``); the core then calls :meth:`widths_from_search`.
    reads_search: ClassVar[bool] = False

    def widths_from_scores(self, dims: ModelDims, scores: Sequence[Sequence[float]]) -> list[int]:
        """The widths given ``scores[l][i]``, the importance of neuron i of layer l of the model
        being pruned (higher: kept longer; ``len(scores[l])`` is layer l's pretrained width):
        ``dims.n_layers`` multiples of ``dims.multiple_of`` summing to ``dims.budget``, none
        above ``dims.max_width``."""
        raise NotImplementedError

    def widths_from_blocks(
        self,
        dims: ModelDims,
        scores: Sequence[Sequence[float]],
        blocks: Sequence[BlockLinears],
    ) -> list[int]:
        """The widths given the neuron ``scores`` and ``blocks[l]``, every linear map of decoder
        layer l with its calibration input RMS (what the core calls when
        :attr:`reads_block_linears` is set; by default :meth:`widths_from_scores`)."""
        return self.widths_from_scores(dims, scores)

    def widths_from_losses(
        self, dims: ModelDims, scores: Sequence[Sequence[float]], losses: CutLosses
    ) -> list[int]:
        """The widths given the neuron ``scores`` and ``losses``, the calibration loss of the
        model cut to widths near a base (what the core calls when :attr:`reads_cut_losses` is
        set; by default :meth:`widths_from_scores`)."""
        return self.widths_from_scores(dims, scores)

    def widths_from_search(
        self,
        dims: ModelDims,
        scores: Sequence[Sequence[float]],
        arms: Mapping[str, Sequence[int]],
        search: Search,
    ) -> list[int]:
        """The widths given the neuron ``scores``, ``arms`` (the widths of each arm named by
        :meth:`required_arms`) and ``search``, the fitness of whole allocations on the
        calibration windows with a state that survives a killed process (what the core calls
        when :attr:`reads_search` is set; by default :meth:`widths_from_scores`)."""
        return self.widths_from_scores(dims, scores)

    def widths(self, dims: ModelDims, profiles: Mapping[str, Sequence[float]]) -> list[int]:
        raise UsageError(
            f"{self.kind_name()!r} allocates from the neuron scores of a model being pruned: list "
            "it under [prune] arms (geospec prune)"
        )


class CutLosses(Protocol):
    """The mean next-token loss on the calibration windows (training split) of the model being
    pruned, each layer l keeping its ``widths[l]`` best neurons by the arm's importance, for
    each change of one layer's width: what a search allocation (``greedy``) reads."""

    def __call__(self, widths: Sequence[int], changes: Sequence[tuple[int, int]]) -> list[float]:
        """For each ``(layer, width)`` of ``changes``, the loss with ``widths`` except that
        layer at that width (narrower than ``widths[layer]``)."""
        ...


class Fitness(Protocol):
    """How far the model being pruned, cut to each candidate's widths (layer l keeping its
    ``widths[l]`` best neurons by the arm's importance, repaired as the arm's ``repair`` says
    but always from the unpruned model's inputs: none, mean compensation, or the least-squares
    re-fit), is from the unpruned model on chosen calibration windows (training split, never
    eval text): the mean per-token KL divergence of its next-token distribution from the
    unpruned model's, or its mean next-token loss. Lower is better. What a search allocation
    (``evolve``) scores."""

    windows: int
    """How many calibration windows there are to choose from."""
    window_tokens: int
    """The tokens scored in each window."""

    def __call__(
        self,
        candidates: Sequence[Sequence[int]],
        windows: Sequence[int],
        base: Sequence[int] | None = None,
    ) -> list[float]:
        """Each candidate's fitness on the calibration windows ``windows`` (indices below
        :attr:`windows`). ``base``: widths most candidates share a prefix of layers with (a
        parent), run once so that each candidate runs only from its first layer that differs
        from it; the values are the same without it."""
        ...


class SearchState(Protocol):
    """Where a search keeps what it has done, so that a killed search resumes where it stood:
    JSON-serialisable state, written after each generation (sealed, atomically) and read back
    only when the unit's inputs are the same."""

    def load(self) -> dict[str, Any] | None:
        """The state last saved for this unit's inputs, or None (none, or from other inputs)."""
        ...

    def save(self, state: dict[str, Any]) -> None:
        """Keep ``state`` (and say how the search is going)."""
        ...


@dataclass(frozen=True)
class Search:
    """What ``geospec prune`` hands a search allocation (:attr:`ScoreAllocation.reads_search`):
    its fitness (``fitness("kl")`` or ``fitness("loss")``; ``fitness("kl", top_k=K)``: the KL
    over the unpruned model's K most likely tokens, the rest lumped into one bucket) and its
    resumable state."""

    fitness: Callable[..., Fitness]
    state: SearchState


def reads_scores(schedule: Plugin | type[Plugin]) -> bool:
    """Whether a schedule (instance or class) allocates from neuron scores: a
    :class:`ScoreAllocation`, or a plugin that sets the deprecated ``reads_neuron_scores``."""
    cls = schedule if isinstance(schedule, type) else type(schedule)
    return issubclass(cls, ScoreAllocation) or bool(getattr(cls, "reads_neuron_scores", False))


@dataclass(frozen=True)
class ActivationStats:
    """Calibration statistics of one FFN's hidden activations a (the input of its output
    projection), per neuron, each a float64 tensor of shape (width,): averages over every
    calibration token (count-weighted across batches)."""

    mean: torch.Tensor
    """The signed mean E[a] (what bias compensation puts in place of a cut neuron)."""
    mean_abs: torch.Tensor
    """The mean absolute value E[|a|]."""
    mean_square: torch.Tensor
    """The mean square E[a²] (its square root is the RMS)."""

    @property
    def variance(self) -> torch.Tensor:
        """The population variance over the calibration tokens, E[a²] - E[a]² (clamped at 0
        against rounding)."""
        return (self.mean_square - self.mean**2).clamp(min=0)

    @property
    def rms(self) -> torch.Tensor:
        """The root mean square sqrt(E[a²])."""
        return self.mean_square.clamp(min=0).sqrt()

    @property
    def width(self) -> int:
        return int(self.mean.shape[0])

    def permuted(self, index: torch.Tensor) -> ActivationStats:
        """The statistics of the neurons ``index`` (a permutation or a subset), in that order."""
        return ActivationStats(self.mean[index], self.mean_abs[index], self.mean_square[index])


@dataclass(frozen=True)
class LinearInputs:
    """One linear map of a decoder block (attention q/k/v/o, the MLP's gate/up/down, GPT-2's
    fused ``c_attn``: every ``nn.Linear`` or ``Conv1D`` in it) with the calibration statistic of
    its input that Wanda's per-weight score reads."""

    name: str
    """Its module path inside the decoder layer (``self_attn.q_proj``, ``mlp.down_proj``)."""
    weight: torch.Tensor
    """The weight as out x in (a ``Conv1D``'s transposed), float32 on the CPU (the model's own
    tensor when it is float32 there: read it, never write it)."""
    input_rms: torch.Tensor
    """sqrt(E[x_j²]) per input feature j over every calibration token (float64, shape (in,)):
    ‖X_j‖₂ over the calibration tokens divided by sqrt(tokens), a factor common to every
    linear of the model, which changes no ratio of scores."""

    def wanda_scores(self) -> torch.Tensor:
        """Wanda's score of every weight, |W_ij| x ‖X_j‖₂ (up to that common factor), float64
        out x in."""
        return self.weight.abs().to(self.input_rms.dtype) * self.input_rms.unsqueeze(0)


@dataclass(frozen=True)
class BlockLinears:
    """Every linear map of one decoder layer, with its calibration input RMS (what a
    :class:`ScoreAllocation` that sets ``reads_block_linears`` receives, one per layer)."""

    layer: int
    linears: tuple[LinearInputs, ...]


@dataclass(frozen=True)
class NeuronWeights:
    """One layer's FFN as an importance score sees it: the weights that belong to each hidden
    neuron, float32 on the CPU, neuron i being row i of every input matrix and column i of the
    output matrix (whatever the architecture stores: fused or transposed projections are
    unpacked by :mod:`geospec.measure.cut`)."""

    layer: int
    inputs: tuple[torch.Tensor, ...]
    """The input projections, each (width x d_model): W_in, or the gate and up projections of a
    gated (SwiGLU, GeGLU) FFN."""
    output: torch.Tensor
    """The output projection (d_model x width)."""
    activation: torch.Tensor | None
    """Mean absolute hidden activation per neuron (width,), the input of the output projection
    averaged over the calibration tokens (float32; the same numbers as ``stats.mean_abs``); None
    when the score asked for none (:attr:`Importance.needs_activations`)."""
    stats: ActivationStats | None = None
    """The calibration statistics per neuron (signed mean, mean |a|, mean square; float64), given
    with ``activation`` when the score :attr:`Importance.needs_activations`; None otherwise."""
    second_moment: torch.Tensor | None = None
    """E[a a^T] over the calibration tokens, (width x width) float64: the hidden activations'
    second moments (the Hessian of the output projection's least-squares error), given when the
    score :attr:`Importance.needs_second_moments`; None otherwise."""

    @property
    def width(self) -> int:
        return int(self.output.shape[1])


class Importance(Plugin):
    """Scores the hidden neurons of one FFN: the higher the score, the later a neuron is cut.

    ``scores(ffn)`` receives a :class:`NeuronWeights` and returns a float tensor of shape
    ``(ffn.width,)``, finite, with no gradient. The neurons kept at a width w are the w best by
    score (ties: the lower index first); the ordering of every layer is computed once, stored and
    reused at every width. A score that needs activations sets ``needs_activations`` and reads
    ``ffn.activation`` (mean |a|) or ``ffn.stats`` (:class:`ActivationStats`: signed mean, mean
    |a|, mean square, variance); a random control must be seeded by its params and the layer.
    """

    register_hook: ClassVar[str] = "geospec_register_importances"
    """The hook that registers plugins of this kind."""
    #: Whether scores read ``ffn.activation`` or ``ffn.stats`` (calibration tokens are run
    #: through the model).
    needs_activations: ClassVar[bool] = False
    #: Whether scores read ``ffn.second_moment`` (each layer's width x width float64 moments:
    #: structured OBS); such a score also gets ``ffn.stats``.
    needs_second_moments: ClassVar[bool] = False

    def scores(self, ffn: NeuronWeights) -> torch.Tensor:
        raise NotImplementedError


@dataclass(frozen=True)
class TrainingRun:
    """One arm-seed run of the train stage: what a launcher hands to a :class:`RunTrainer`."""

    arm: str
    seed: int
    directory: Path
    """Its training directory (``arms/<arm>/seed-<k>``), claimed by whoever trains it."""
    key: str
    """Its run key (``run_key.json``): the same run has the same key wherever it is trained."""

    @property
    def name(self) -> str:
        """``<arm>/seed-<k>``, how messages and ``geospec status`` name the run."""
        return f"{self.arm}/seed-{self.seed}"


@dataclass(frozen=True)
class RunOutcome:
    """What became of one run handed to a launcher.

    ``done``: trained (or found finished); ``held``: another process holds its claim;
    ``failed``: it raised (``detail`` is the last line of the error, also recorded in the
    training directory); ``submitted``: sent to a scheduler (``detail`` names the job);
    ``preempted``: checkpointed on SIGTERM/SIGUSR1 and stopped, to be requeued.
    ``exit_code``: a failed run's error's exit status (2: the input or the machine must change,
    a full disk say; 1 otherwise); the train stage exits 2 when every failure asks for it.
    """

    run: TrainingRun
    state: Literal["done", "held", "failed", "submitted", "preempted"]
    detail: str = ""
    exit_code: int = 1


class RunTrainer(Protocol):
    """Trains one run in the calling process: claims its directory (one process per run, whoever
    launched it), trains or resumes it, records a failure in the directory and re-raises it.

    It pickles (its cached data and console stay behind): a launcher may ship it to worker
    processes or scheduler jobs. ``threads``: torch's CPU threads in this process (a worker's
    share of the machine); a spec's ``train.threads`` still wins.
    """

    def __call__(self, run: TrainingRun, threads: int | None = None) -> RunOutcome: ...


@dataclass(frozen=True)
class Launch:
    """What the train stage gives a launcher: the runs still to train, in order (seed-major), the
    trainer of one run, the run directory (a launcher's own files go under
    ``<run_dir>/launch/``) and where to say what it did.

    A launcher that hands runs to a scheduler also gets ``spec``, the spec file being run (a
    later job may run ``geospec run SPEC --out RUN_DIR`` to finish the pipeline), and
    ``recorded``, what a run's training directory already says about it without training it:
    ``done`` (with its final loss), ``failed`` (with its error) or None (neither)."""

    runs: tuple[TrainingRun, ...]
    trainer: RunTrainer
    run_dir: Path
    say: Callable[[str], None]
    spec: Path | None = None
    recorded: Callable[[TrainingRun], RunOutcome | None] = lambda run: None
    overrides: tuple[str, ...] = ()
    """The ``--set dotted.key=value`` values ``spec`` was loaded with: a later job that runs
    ``geospec run SPEC`` passes each as ``--set``, or it would run another spec."""


class Launcher(Plugin):
    """Decides where and when the arm-seed runs of the train stage are trained.

    ``launch(launch)`` calls ``launch.trainer(run)`` once for every run of ``launch.runs``,
    somewhere: in this process one after another (``local``), in worker processes on this
    machine (``pool``), in scheduler jobs (``slurm``). It returns one :class:`RunOutcome` per run
    it handled. The trainer claims each run's directory, so two launchers (or two ``geospec run``
    processes) sharing a run directory never train the same run twice, and a run gives the same
    result wherever it is trained. A launcher that only submits work returns ``submitted``
    outcomes; the train stage then stays unfinished and the next ``geospec run`` (or ``geospec
    status``) finds the runs trained. A failed run's error reaches the train stage, either raised
    by the trainer (a launcher that trains in its own process may let it propagate) or as a
    ``failed`` outcome.
    """

    register_hook: ClassVar[str] = "geospec_register_launchers"
    """The hook that registers plugins of this kind."""
    #: Whether it can run under torchrun (every rank calls the trainer for every run, in order).
    under_torchrun: ClassVar[bool] = False

    def launch(self, launch: Launch) -> list[RunOutcome]:
        raise NotImplementedError

    def job_script(self, run_dir: Path, runs: int) -> str | None:
        """The scheduler script this launcher would submit to train ``runs`` runs of
        ``run_dir``, rendered without submitting anything (``geospec rehearse --job-script``);
        None for a launcher that submits no script (the default)."""
        return None


@dataclass(frozen=True)
class TrackedRun:
    """One training run as an experiment tracker sees it (what :meth:`Tracker.start` receives)."""

    name: str
    """``<arm>/seed-<k>`` (``reference/seed-<k>`` for the reference): the tracker run's name."""
    group: str
    """The spec's name: runs of one study are grouped (wandb group, mlflow experiment, ...)."""
    id: str
    """Stable across resumes (derived from the run key): a resumed run continues this id."""
    directory: Path
    """Its training directory (``metrics.jsonl`` is there)."""
    run_dir: Path
    """The run directory: a tracker's local files go under it unless its params say where."""
    config: Mapping[str, Any]
    """``arm``, ``seed``, ``widths`` (the FFN width of every layer), ``run_key`` and the
    trainer's ``fingerprint`` (what makes two runs the same experiment)."""
    step: int = 0
    """The step training starts from: 0, or the checkpoint a resumed run continues from."""


class Tracker(Plugin):
    """Watches training runs for an experiment tracker (TensorBoard, W&B, MLflow, ...).

    A spec lists trackers in ``[train] trackers``; each training run gets a fresh instance
    (``cls(params)``), on rank 0 only. ``start(run)`` opens (or, for a resumed run, reopens) the
    tracker's run; ``log(step, metrics)`` receives each row ``metrics.jsonl`` gets, under the
    same names (``loss``, ``lr``, ``tokens``, ``tokens_per_s``; ``val_loss``); ``end(result)``
    receives the run's ``result.json`` values (``final_val_loss``, ``steps``, ``tokens``,
    ``tokens_per_second``, ``params``, ...), or None when the run stopped early (preempted or
    failed; a later start continues it). Import the tracker's library inside these methods. A
    method that raises turns this tracker off for the run with one warning: trackers never stop
    training, and they change no run key.
    """

    register_hook: ClassVar[str] = "geospec_register_trackers"
    """The hook that registers plugins of this kind."""

    def start(self, run: TrackedRun) -> None:
        raise NotImplementedError

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        raise NotImplementedError

    def end(self, result: Mapping[str, Any] | None) -> None:
        raise NotImplementedError


__all__ = [
    "KINDS",
    "ActivationStats",
    "BlockLinears",
    "CutLosses",
    "Fitness",
    "Geometry",
    "Importance",
    "InfeasibleBudget",
    "Launch",
    "Launcher",
    "LinearInputs",
    "ModelDims",
    "NeuronWeights",
    "RunOutcome",
    "RunTrainer",
    "Schedule",
    "ScoreAllocation",
    "Search",
    "SearchState",
    "Smoother",
    "Solver",
    "Statistic",
    "TrackedRun",
    "Tracker",
    "TrainingRun",
    "WidthProblem",
    "check_profile",
    "reads_scores",
    "resample_profile",
    "round_to_budget",
    "units_between",
]

#: The one table of plugin kinds: kind name -> contract (whose ``register_hook`` names the hook
#: that registers it), in the order they are listed everywhere.
KINDS: dict[str, type[Plugin]] = {
    "geometry": Geometry,
    "statistic": Statistic,
    "smoother": Smoother,
    "solver": Solver,
    "schedule": Schedule,
    "launcher": Launcher,
    "tracker": Tracker,
    "importance": Importance,
}
