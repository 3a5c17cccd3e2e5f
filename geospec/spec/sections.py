"""The spec: what a researcher writes in TOML, as pydantic models.

Plugin tables (``geometry``, ``statistic``, ``schedule``, ...) are validated through the registries
in effect (:mod:`geospec.plugin`). Checks that span sections live in :func:`cross_check`;
reading a file and turning errors into messages lives in :mod:`geospec.spec.loading`.
"""

from __future__ import annotations

import re
import warnings
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from geospec.data.bundled import DEFAULT_CORPUS, mix_recipe
from geospec.hub import HUB_ID
from geospec.plugin import (
    GeometryRef,
    ImportanceRef,
    LauncherRef,
    ScheduleRef,
    StatisticRef,
    TrackerRef,
)
from geospec.plugin_base import ADDED_LATER, AddedLater
from geospec.stats import MIN_RELIABILITY

Name = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=100)]
Seed = Annotated[int, Field(ge=0, lt=2**32)]
"""Seeds are what torch and numpy accept: integers in [0, 2**32)."""
COMMIT = re.compile(r"^[0-9a-f]{40}$")
"""A git commit id, the only hub revision that cannot move (branches and tags can)."""


def pinned_revision_problem(location: str | None, revision: str | None, field: str) -> str | None:
    """Why ``revision`` cannot pin the hub model named ``location`` (``field`` names the option
    holding the id), or None when it can."""
    if revision is None:
        return None
    if location is None:
        return f"pins a hub model, but {field} names none"
    if not HUB_ID.match(location) or location.endswith(".gguf"):
        return (
            f"pins a Hugging Face hub model; {field} = {location!r} is not a hub id "
            "('organisation/name'); drop revision for a local directory or .gguf file"
        )
    if not COMMIT.match(revision):
        return (
            f"{revision!r} is not a commit id: give the 40-hex commit (branches and tags move; "
            "the model page's 'Files and versions' history lists commits)"
        )
    return None


ComputeDtype = Literal["auto", "float32", "bfloat16", "float16"]
"""What a stage's forward passes compute in (:mod:`geospec.hardware`)."""


class Bookkeeping:
    """Marks a train option that changes how a run is carried out (CPU threads, how often it
    saves and logs, who watches it) but not what it computes: run keys see it at its default, so
    changing it never retrains anything, and it is not part of the trainer's fingerprint."""


BOOKKEEPING = Bookkeeping()


class Fingerprinted:
    """Marks a train option that is part of the trainer's fingerprint (what a training directory
    refuses to mix; :func:`geospec.engine.identity.fingerprint`): an entry of its own, or, with
    ``group``, a place in that entry's list (in field order)."""

    def __init__(self, group: str | None = None) -> None:
        self.group = group


FINGERPRINT = Fingerprinted()
OPTIMIZER = Fingerprinted("optimizer")
"""The optimizer's settings: one list in the fingerprint, in the order the fields are declared."""


def marked(section: type[BaseModel], marker: type[Any]) -> dict[str, Any]:
    """The fields of ``section`` that carry a marker of type ``marker``, in declaration order,
    each with its marker."""
    found: dict[str, Any] = {}
    for name, field in section.model_fields.items():
        for meta in field.metadata:
            if isinstance(meta, marker):
                found[name] = meta
    return found


class Section(BaseModel):
    model_config = ConfigDict(
        extra="forbid", use_attribute_docstrings=True, frozen=True, allow_inf_nan=False
    )

    def key_form(self) -> dict[str, Any]:
        """The section's JSON form as run keys and caches see it: options added later
        (:class:`AddedLater`) are left out while they have their default."""
        dumped = self.model_dump(mode="json")
        for name, field in type(self).model_fields.items():
            value = getattr(self, name)
            default = field.get_default(call_default_factory=True)
            if any(isinstance(m, AddedLater) for m in field.metadata) and value == default:
                dumped.pop(name, None)
            elif isinstance(value, Section):
                dumped[name] = value.key_form()
            elif isinstance(value, list | tuple) and any(isinstance(v, Section) for v in value):
                # a list of sections (prune arms) may hold options added later too
                dumped[name] = [v.key_form() if isinstance(v, Section) else v for v in value]
        return dumped


class ModelSpec(Section):
    """The target architecture: a GPT-style pre-norm decoder."""

    n_layers: int = Field(ge=1, le=512)
    """Number of transformer blocks."""
    d_model: int = Field(ge=8, le=65536)
    """Width of the residual stream."""
    n_heads: int = Field(ge=1, le=1024)
    """Attention heads; must divide d_model."""
    n_kv_heads: Annotated[int | None, ADDED_LATER, Field(ge=1, le=1024)] = None
    """Key/value heads (grouped-query attention, as in Llama 3 or SmolLM2); must divide n_heads.
    Omit for one key/value head per query head."""
    ffn_width: int = Field(ge=1, le=1_048_576)
    """The uniform FFN hidden width. Every arm keeps n_layers * ffn_width exactly (the budget)."""
    activation: Literal["gelu", "swiglu"] = "gelu"
    """FFN activation: gelu (2 matrices) or swiglu (3 matrices)."""
    seq_len: int = Field(ge=2, le=1_048_576)
    """Context length in tokens."""
    vocab_size: int | None = Field(None, ge=2, le=4_194_304)
    """Vocabulary size; omit to take it from the tokenizer."""
    multiple_of: int = Field(64, ge=1, le=65536)
    """Every FFN width is rounded to a multiple of this."""
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    positions: Literal["learned", "rope"] = "learned"
    """Learned absolute position embeddings (GPT-2) or rotary embeddings."""
    rope_theta: float = Field(10000.0, gt=0)
    tie_embeddings: bool = True
    """Share the token embedding with the output projection."""
    bias: bool = True
    """Biases in linear layers and LayerNorm."""
    dropout: float = Field(0.0, ge=0.0, lt=1.0)


class BPETokenizer(Section):
    """A byte-level BPE trained with `tokenizers` on the training split (cached in the run dir)."""

    kind: Literal["bpe"] = "bpe"
    vocab_size: int = Field(4096, ge=260, le=1_048_576)
    min_frequency: int = Field(2, ge=1)


class GPT2Tokenizer(Section):
    """GPT-2's BPE from local files (vocab.json + merges.txt); the package ships a copy."""

    kind: Literal["gpt2"] = "gpt2"
    path: str | None = None
    """Directory holding vocab.json and merges.txt; omit for the bundled copy."""


class PretrainedTokenizer(Section):
    """A pretrained tokenizer, loaded by transformers' AutoTokenizer."""

    kind: Literal["pretrained"] = "pretrained"
    path: str
    """A local model directory, a .gguf file (its embedded tokenizer), or a Hugging Face hub id
    with `revision`."""
    trust_remote_code: Annotated[bool, ADDED_LATER] = False
    """Run Python code shipped with the tokenizer (its auto_map). Only for sources you trust."""
    revision: Annotated[str | None, ADDED_LATER] = None
    """The commit (40-hex id) of the hub model `path` names; read through the Hugging Face cache."""

    @field_validator("revision")
    @classmethod
    def _pinned(cls, revision: str | None, info: ValidationInfo) -> str | None:
        if problem := pinned_revision_problem(info.data.get("path"), revision, "path"):
            raise ValueError(problem)
        return revision


Tokenizer = Annotated[
    BPETokenizer | GPT2Tokenizer | PretrainedTokenizer, Field(discriminator="kind")
]


class DataSpec(Section):
    """Where text comes from and how it becomes tokens."""

    source: str | None = None
    """'bundled:mix' (the default: novels, drama, code and modern prose in equal shares, its
    validation split the same mix), one bundled corpus ('bundled:austen', 'bundled:shakespeare',
    'bundled:python-code', 'bundled:python-docs'), or a Hugging Face hub dataset name. Until
    0.2.0 the default was 'bundled:austen': a spec that relied on it now reads the mix (write
    source = "bundled:austen" to keep Austen)."""
    files: list[str] | None = None
    """Local .txt/.jsonl/.parquet files (relative to the spec file); replaces source."""
    hub_config: str | None = None
    hub_split: str = "train"
    hub_revision: str | None = None
    """Hub revision (branch, tag or commit) to pin the dataset's content; for datasets that still
    ship a loading script (refused by datasets 4 and later), 'refs/convert/parquet' reads the
    hub's parquet conversion. Offline (HF_HUB_OFFLINE=1) it is read from the Hugging Face cache."""
    text_field: str = "text"
    streaming: bool = False
    max_documents: int | None = Field(None, ge=1)
    """Use only the first N documents (useful with huge hub datasets)."""
    val_fraction: float = Field(0.05, gt=0.0, le=1.0)
    """Fraction of documents held out for validation (deterministic by split_seed). Below 0.5
    when anything is trained; 1.0 puts the whole text into the validation split (a probe-only
    spec with a pretrained checkpoint, which trains nothing)."""
    split_seed: Seed = 0
    tokenizer: Tokenizer = Field(default_factory=BPETokenizer)
    txt_documents: Annotated[Literal["paragraphs", "file", "separator"], ADDED_LATER] = "paragraphs"
    """How local .txt files are cut into documents: at blank lines (paragraphs), one document
    per file (file), or at every occurrence of txt_separator (separator)."""
    txt_separator: Annotated[str | None, ADDED_LATER] = None
    """The string between documents when txt_documents = "separator" (for example "\n---\n")."""
    end_of_text: Annotated[bool, ADDED_LATER] = True
    """Put the tokenizer's end-of-text token after every document. false: documents follow each
    other directly, so no window holds a token the text does not contain."""

    @model_validator(mode="after")
    def _one_source(self) -> DataSpec:
        if self.files is not None and self.source is not None:
            raise ValueError("give either source or files, not both")
        if self.files is not None and not self.files:
            raise ValueError("files is empty: list at least one file, or remove it")
        if (self.txt_documents == "separator") != (self.txt_separator is not None):
            raise ValueError(
                'txt_separator goes with txt_documents = "separator": give both, or neither'
            )
        if self.txt_separator == "":
            raise ValueError('txt_separator is empty; use txt_documents = "file" for whole files')
        return self

    @property
    def corpus(self) -> str | None:
        """The dataset source in effect (None when local files are used)."""
        if self.files is not None:
            return None
        return self.source or DEFAULT_CORPUS

    def key_form(self) -> dict[str, Any]:
        """As :meth:`Section.key_form`, with the default corpus named: keys made when the
        default was Austen hold no source, so a run that relied on that default never reuses
        its work for the mix (an explicit source is kept as written: those keys are
        unchanged); the mix's recipe with it."""
        dumped = super().key_form()
        if self.files is None and self.source is None:
            dumped["source"] = DEFAULT_CORPUS
        if dumped["source"] == DEFAULT_CORPUS:
            dumped["mix"] = mix_recipe()
        return dumped


class ReferenceSpec(Section):
    """The uniform model that is probed: trained here, or a pretrained checkpoint."""

    checkpoint: str | None = None
    """A pretrained causal LM: a local Hugging Face model directory, a .gguf file, or a hub id
    ('organisation/name') with `revision`; omit to train the spec's model."""
    train_steps: int | None = Field(None, ge=1, le=100_000_000)
    """Steps to train the reference (default: train.steps)."""
    seed: Seed = 0
    trust_remote_code: Annotated[bool, ADDED_LATER] = False
    """Run Python code shipped with the checkpoint (its auto_map) to build the model. This executes
    the checkpoint's own code: only for checkpoints you trust."""
    revision: Annotated[str | None, ADDED_LATER] = None
    """The commit (40-hex id) of the hub model `checkpoint` names, read through the Hugging Face
    cache (HF_HUB_OFFLINE=1 works once it is cached). Required for a hub id: branches move."""
    dtype: Annotated[Literal["float32", "bfloat16", "float16"], ADDED_LATER] = "float32"
    """The pretrained checkpoint's weights and activations: bfloat16 halves memory (a 7B model
    probes in about 15 GiB; docs/pretrained.md); probed clouds are stored in float32 either way."""

    @model_validator(mode="after")
    def _one_of(self) -> ReferenceSpec:
        if self.checkpoint is not None and self.train_steps is not None:
            raise ValueError("give either checkpoint or train_steps, not both")
        return self

    @field_validator("revision")
    @classmethod
    def _pinned(cls, revision: str | None, info: ValidationInfo) -> str | None:
        if problem := pinned_revision_problem(info.data.get("checkpoint"), revision, "checkpoint"):
            raise ValueError(problem)
        return revision

    @field_validator("dtype")
    @classmethod
    def _pretrained_only(cls, dtype: str, info: ValidationInfo) -> str:
        if dtype != "float32" and info.data.get("checkpoint") is None:
            raise ValueError(
                "applies to a pretrained checkpoint; the spec's own reference trains with "
                "train.precision"
            )
        return dtype


class ProbeSpec(Section):
    """Which token states are captured from the reference model."""

    tokens: int = Field(1024, ge=4, le=1_000_000)
    """Number of token states per cloud."""
    sequences: int | None = Field(None, ge=1)
    """Validation sequences to sample tokens from (default: as many as needed)."""
    site: Literal["residual", "ffn"] = "residual"
    """residual: the stream before/after the FFN sub-layer; ffn: normalised FFN input and output."""
    skip_first: int = Field(0, ge=0)
    """Skip the first positions of each sequence (attention-sink tokens)."""
    skip_special: bool = True
    """Never sample special tokens (such as the end-of-text separator)."""
    seed: Seed = 0
    batch_size: int = Field(8, ge=1, le=65536)
    """Sequences per forward pass while probing."""
    replicates: Annotated[int, ADDED_LATER, Field(ge=1, le=1000)] = 1
    """Measure every profile on this many disjoint token samples (each of `tokens` positions
    from its own windows); the solver uses their mean and the report their spread."""
    calibration_split: Annotated[Literal["val", "train"], ADDED_LATER] = "val"
    """The split of [data] the reference is measured on: the probe's tokens, the diagnose and
    demand losses and demand's calibration. A spec with [prune] defaults to "train" (its eval
    windows, the first validation windows of each corpus, then reach nothing but the pruned
    models' scores); any other to "val"."""
    compute_dtype: Annotated[ComputeDtype, ADDED_LATER] = "float32"
    """The precision of the probe's forward passes: "float32" (the default: exact, what the
    committed results were computed in), "bfloat16", "float16" (GPUs only), or "auto": bfloat16
    where the hardware computes it natively (AVX512_BF16 or AMX on a CPU, a GPU that does),
    float32 elsewhere. Autocast over the weights as loaded (reference.dtype, unchanged); keys
    hold the dtype it resolves to, so float32 and bfloat16 results never mix (docs/prune.md,
    "Compute dtype and threads")."""


class MeasureSpec(Section):
    """One work profile: a geometry x statistic pair."""

    geometry: GeometryRef
    statistic: StatisticRef
    name: str | None = None
    """Profile name (default 'statistic/geometry', for example 'topology/hyperbolic')."""

    @property
    def profile(self) -> str:
        return self.name or f"{self.statistic.kind}/{self.geometry.kind}"


class ArmSpec(Section):
    """One trained schedule of the experiment."""

    name: Name
    schedule: ScheduleRef


class TrainSpec(Section):
    """How every arm (and, by default, the reference) is trained."""

    steps: int | None = Field(None, ge=1, le=100_000_000)
    """Optimizer steps; or give tokens."""
    tokens: int | None = Field(None, ge=1, le=10**15)
    """Training tokens per run; steps = ceil(tokens / (batch_size * seq_len))."""
    batch_size: Annotated[int, FINGERPRINT] = Field(32, ge=1, le=1_048_576)
    """Global batch in sequences (independent of the number of processes)."""
    micro_batch_size: int | None = Field(None, ge=1)
    """Sequences per forward pass per process; the rest is gradient accumulation."""
    lr: Annotated[float, OPTIMIZER] = Field(6e-4, gt=0.0, le=10.0)
    min_lr_ratio: Annotated[float, OPTIMIZER] = Field(0.1, ge=0.0, le=1.0)
    """Final learning rate of the cosine decay, as a fraction of lr."""
    warmup: Annotated[int, OPTIMIZER] = Field(0, ge=0)
    """Linear warmup steps."""
    weight_decay: Annotated[float, OPTIMIZER] = Field(0.1, ge=0.0, le=10.0)
    betas: Annotated[tuple[float, float], OPTIMIZER] = (0.9, 0.95)
    eps: Annotated[float, OPTIMIZER] = Field(1e-8, gt=0.0)
    grad_clip: Annotated[float, OPTIMIZER] = Field(1.0, ge=0.0)
    """Gradient-norm clipping (0 disables)."""
    seeds: list[Seed] = Field(default_factory=lambda: [0], min_length=1, max_length=1000)
    device: str = "auto"
    """'auto' (cuda when available), 'cpu', 'cuda', 'cuda:1', 'mps'."""
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    """auto: bf16 autocast on CUDA, fp32 elsewhere."""
    compile: bool = False
    """torch.compile the model."""
    eval_interval: int = Field(0, ge=0)
    """Evaluate every N steps (0: only at the end)."""
    eval_tokens: Annotated[int | None, FINGERPRINT] = Field(None, ge=1)
    """Validation tokens used per evaluation (default: the whole validation split)."""
    checkpoint_interval: Annotated[int, BOOKKEEPING] = Field(100, ge=1)
    log_interval: Annotated[int, BOOKKEEPING] = Field(10, ge=1)
    distributed: Literal["ddp", "fsdp2"] = "ddp"
    """Data parallelism under torchrun."""
    threads: Annotated[int | None, BOOKKEEPING] = Field(None, ge=1)
    """torch intra-op threads on CPU (default: torch's)."""
    trackers: Annotated[tuple[TrackerRef, ...], ADDED_LATER, BOOKKEEPING, Field(max_length=16)] = ()
    """Experiment trackers that watch every training run, for example
    [{ kind = "tensorboard" }, { kind = "wandb", mode = "offline" }, { kind = "mlflow" }]
    (docs/trackers.md). Observing a run changes no run key: trackers can be added at any time."""

    def with_steps(self, steps: int | None) -> TrainSpec:
        """These settings with a budget of ``steps`` optimizer steps instead of the spec's
        (``geospec train --steps``, a reference's ``train_steps``); None: these settings."""
        if steps is None:
            return self
        return self.model_copy(update={"steps": steps, "tokens": None})

    @model_validator(mode="after")
    def _steps_or_tokens(self) -> TrainSpec:
        if (self.steps is None) == (self.tokens is None):
            raise ValueError("give exactly one of steps or tokens")
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError("seeds must be unique")
        if self.micro_batch_size is not None and self.batch_size % self.micro_batch_size:
            raise ValueError(
                f"batch_size {self.batch_size} is not a multiple of micro_batch_size "
                f"{self.micro_batch_size}"
            )
        return self


class ReportSpec(Section):
    baseline: str = "uniform"
    """The arm every other arm is compared with (paired by seed)."""
    confidence: float = Field(0.95, gt=0.5, lt=1.0)
    bootstrap: int = Field(10000, ge=0, le=10_000_000)
    """Bootstrap resamples for the paired difference (used with 5 or more seeds; 0 disables)."""
    plots: bool = True
    min_reliability: Annotated[float, ADDED_LATER, Field(ge=-1.0, le=1.0)] = MIN_RELIABILITY
    """Flag a profile measured with probe.replicates > 1 whose split-half reliability (Spearman
    between the means of two halves of its replicates) is below this: mostly sampling noise."""
    compare: Annotated[list[tuple[Name, Name]], ADDED_LATER] = []
    """Further paired comparisons, each ``[arm, against]`` (e.g. an arm solved from another
    model's profiles against the same schedule solved from this model's): reported like the
    comparisons with the baseline, Holm-adjusted across these pairs."""


class DiagnoseSpec(Section):
    """Diagnostics of the reference model (docs/diagnostics.md): residual norms, intrinsic
    dimension, layer sensitivity and local additivity, also usable as solver inputs."""

    enabled: bool = False
    """Run the diagnose stage (between measure and solve); `geospec diagnose` runs it regardless."""
    eps: float = Field(0.1, gt=0.0, lt=1.0)
    """Layer sensitivity scales a layer's FFN sub-layer output by (1 - eps). 0.1 keeps the
    perturbation local (the loss change is close to quadratic in eps) while staying well above
    the rounding noise of the loss."""
    windows: int = Field(16, ge=1, le=1_000_000)
    """Validation windows of model.seq_len tokens the loss is measured on (the first ones)."""
    batch_size: int = Field(4, ge=1, le=65536)
    """Windows per forward pass while measuring the loss."""
    pairs: int = Field(32, ge=0, le=1_000_000)
    """Layer pairs sampled for local additivity (all pairs when there are fewer; 0 skips it)."""
    seed: Seed = 0
    """Seed of the pair sample."""
    twonn_discard: float = Field(0.1, gt=0.0, lt=1.0)
    """Fraction of the largest nearest-neighbour ratios TwoNN discards (the paper's 0.1)."""
    compute_dtype: Annotated[ComputeDtype, ADDED_LATER] = "float32"
    """The precision of the diagnose stage's forward passes (its losses): "float32" (the default:
    exact, what the committed results were computed in), "bfloat16", "float16" (GPUs only), or
    "auto": bfloat16 where the hardware computes it natively (AVX512_BF16 or AMX on a CPU, a GPU
    that does), float32 elsewhere. Autocast over the weights as loaded (reference.dtype,
    unchanged); keys hold the dtype it resolves to, so float32 and bfloat16 results never mix
    (docs/prune.md, "Compute dtype and threads")."""


KeepFraction = Annotated[float, Field(gt=0.0, lt=1.0)]


class DemandSpec(Section):
    """Measured demand (docs/demand.md): each layer's FFN cut to fractions of its neurons on the
    reference, the loss increase fitted to the surrogate lambda_l (w^-a_l - W^-a_l)."""

    enabled: bool = False
    """Run the demand stage (between diagnose and solve); `geospec demand` runs it regardless."""
    keep: list[KeepFraction] = Field(
        default_factory=lambda: [0.75, 0.5, 0.25, 0.125], min_length=2, max_length=64
    )
    """Fractions of each layer's neurons kept, each strictly between 0 and 1 (rounded to
    multiples of model.multiple_of); at least two, for the two-parameter fit."""
    importance: ImportanceRef = Field({"kind": "activation"}, validate_default=True)
    """Which neurons a cut keeps: an importance table (`geospec plugins` lists them); the
    activation score runs the probe's windows through the model for its calibration."""
    windows: int = Field(16, ge=1, le=1_000_000)
    """Validation windows of model.seq_len tokens the loss is measured on (the first ones)."""
    batch_size: int = Field(4, ge=1, le=65536)
    """Windows per forward pass while measuring the loss."""
    pairs: int = Field(16, ge=0, le=1_000_000)
    """Layer pairs cut together to check additivity (all pairs when there are fewer; 0 skips)."""
    pair_keep: KeepFraction = 0.5
    """The fraction both layers of a pair keep; one of `keep`."""
    seed: Seed = 0
    """Seed of the pair sample."""
    compute_dtype: Annotated[ComputeDtype, ADDED_LATER] = "float32"
    """The precision of the demand stage's forward passes (its calibration and losses): "float32"
    (the default: exact, what the committed results were computed in), "bfloat16", "float16"
    (GPUs only), or "auto": bfloat16 where the hardware computes it natively (AVX512_BF16 or AMX
    on a CPU, a GPU that does), float32 elsewhere. Autocast over the weights as loaded
    (reference.dtype, unchanged); keys hold the dtype it resolves to, so float32 and bfloat16
    results never mix (docs/prune.md, "Compute dtype and threads")."""

    @model_validator(mode="after")
    def _distinct_and_paired(self) -> DemandSpec:
        if len(set(self.keep)) != len(self.keep):
            raise ValueError(f"keep fractions must be distinct, got {self.keep}")
        if self.pairs and self.pair_keep not in self.keep:
            raise ValueError(
                f"pair_keep {self.pair_keep} is not one of keep {self.keep}; add it to keep"
            )
        return self


class PruneCalibration(Section):
    """The calibration samples importance scores are computed on (from the training split)."""

    windows: int = Field(16, ge=1, le=1_000_000)
    """Windows of model.seq_len tokens in each calibration sample."""
    seeds: list[Seed] = Field(default_factory=lambda: [0], min_length=1, max_length=1000)
    """Seed k draws calibration sample k; the arms are paired by it."""
    batch_size: int = Field(4, ge=1, le=65536)
    """Windows per forward pass."""

    @field_validator("seeds")
    @classmethod
    def _distinct(cls, seeds: list[int]) -> list[int]:
        if len(set(seeds)) != len(seeds):
            raise ValueError(f"seeds must be distinct, got {seeds}")
        return seeds


class PruneEval(Section):
    """Where the pruned models' perplexity is measured: held-out windows of each corpus."""

    corpora: list[Annotated[str, Field(min_length=1)]] = Field(
        default_factory=lambda: [DEFAULT_CORPUS], min_length=1
    )
    """Bundled corpora ('bundled:mix', the default; 'bundled:austen', 'bundled:shakespeare',
    'bundled:python-code', 'bundled:python-docs') or text files (relative to the spec file),
    tokenized like [data]; the validation split of each (never calibration text). Where one
    is [data]'s own text (the mix by default) its first windows are scored and the selection
    windows are its last ones, checked apart."""
    windows: int = Field(32, ge=1, le=1_000_000)
    """Validation windows of model.seq_len tokens per corpus (the first ones)."""
    batch_size: int = Field(4, ge=1, le=65536)
    """Windows per forward pass."""


class PruneSelect(Section):
    """Which arm to ship, chosen without eval text (docs/prune.md, "What to ship")."""

    windows: int = Field(8, ge=1, le=1_000_000)
    """The last windows of model.seq_len tokens of [data]'s validation split: what no
    width-setting stage reads (they read the training split) and no eval window overlaps (the
    eval reads each corpus's first windows). Per keep fraction the arm with the lowest mean loss
    on them, over every calibration seed, is recommended."""
    runtime: Annotated[bool, ADDED_LATER] = True
    """Time the recommended model in llama.cpp against the source GGUF file (prompt and
    generation speed, best and median of 5 rounds on 2 threads: seconds per keep fraction),
    where the reference is a GGUF file and llama-cpp-python is installed; false: its sizes and
    score only. Not part of what a unit computes: changing it recomputes no unit (docs/prune.md,
    "What to ship")."""
    shipped: Annotated[bool, ADDED_LATER] = False
    """Recommend by the loss of each arm's GGUF file (the file `--export best@KEEP --format
    gguf` writes, its de-quantized weights) on the selection windows instead of the float32
    model's: what is shipped is what is chosen. Each unit's file is written and scored once
    (seconds per unit); where the reference is no GGUF file there is none, and the float32
    models decide (said in the output and in prune.json)."""


class PruneLstsq(Section):
    """The least-squares repair's settings (`repair = "lstsq"`; docs/prune.md, "Repair")."""

    damping: float = Field(0.1, ge=0.0, le=1e6)
    """lambda / mean(diag H_KK): how far the re-fitted kept columns are pulled back towards the
    original ones (SparseGPT's relative dampening; 0: plain least squares). The default is the
    better of 0.1 and 0.01 at the default text (4k tokens) on SmolLM2-135M; with 32k tokens 0.01
    was better (docs/results/smollm2-135m-repair-text)."""
    inputs: Literal["unpruned", "sequential"] = "unpruned"
    """Whose activations every layer is re-fitted on: "unpruned", the unpruned model's (one
    calibration pass for every layer and unit of a seed); "sequential", the model's whose
    earlier layers are already cut and repaired (a walk of about two passes per unit)."""
    windows: int | None = Field(None, ge=1, le=1_000_000)
    """Calibration windows of model.seq_len tokens the re-fit reads (drawn from the training
    split with the calibration seed); omit for prune.calibration.windows (the same windows)."""
    intercept: bool = True
    """Re-fit an intercept too, a bias on the output projection (its export needs a family whose
    MLP carries one: Llama's mlp_bias, GPT-2, llama.cpp's deci GGUF); false: the kept columns
    alone, no bias, for families whose transformers MLP has none (Qwen2, Mistral, Gemma)."""


#: What a cut's kept neurons become (docs/prune.md, "Repair"): "none", cut only; "mean", FLAP's
#: bias compensation (each removed neuron's calibration mean in place of its activation); "lstsq",
#: the output projection's kept columns and an intercept re-fitted by least squares on the
#: calibration text (geospec.prune.repair).
RepairKind = Literal["none", "mean", "lstsq"]


def _deprecated_compensate(where: str, compensate: str | None, repair: str | None) -> None:
    """``compensate`` is ``repair``'s old name: both set is refused, the old one warns."""
    if compensate is None:
        return
    if repair is not None:
        raise ValueError(
            f"{where}compensate and {where}repair are both set: compensate is repair's old "
            f'name; keep repair alone (compensate = "mean" is repair = "mean")'
        )
    warnings.warn(
        f'{where}compensate is deprecated: write {where}repair = "{compensate}" (the same '
        'computation; repair also offers "lstsq", docs/prune.md)',
        DeprecationWarning,
        stacklevel=2,
    )


class PruneArmSpec(ArmSpec):
    """One allocation of a prune: a schedule, and optionally its own importance score and
    repair instead of the prune's (FLAP as its paper runs it: `importance = { kind =
    "fluctuation" }, repair = "mean"`)."""

    importance: Annotated[ImportanceRef | None, ADDED_LATER] = None
    """Which neurons this arm's layers keep, and the scores its score allocation (flap, owl)
    reads; omit for prune.importance."""
    repair: Annotated[RepairKind | None, ADDED_LATER] = None
    """What this arm's kept neurons become ("none", "mean" or "lstsq"); omit for prune.repair."""
    lstsq: Annotated[PruneLstsq | None, ADDED_LATER] = None
    """This arm's least-squares repair settings; omit for prune.lstsq."""
    compensate: Annotated[Literal["none", "mean"] | None, ADDED_LATER] = None
    """Deprecated: repair's old name (`compensate = "mean"` is `repair = "mean"`)."""
    grid: Annotated[dict[str, list[Any]] | None, ADDED_LATER] = None
    """A sweep: each schedule param's values (`{ lam = [0.02, 0.05], m = [3, 5] }`); the arm
    becomes one arm per setting, named `<name>-lam0.02-m3` and so on (docs/prune.md). Expanded
    when the spec is read: an expanded arm holds no grid."""
    sweep: Annotated[Name | None, ADDED_LATER] = None
    """The grid arm this arm was expanded from (set by `grid`): the sweep's arms are scored on
    the calibration windows too, and the best by calibration loss is reported."""

    @model_validator(mode="after")
    def _repair_named_once(self) -> PruneArmSpec:
        _deprecated_compensate(f"arm {self.name!r}: ", self.compensate, self.repair)
        return self


def _expanded_grids(arms: Any) -> Any:
    """Every arm table with a `grid` (param -> list of values) as one arm per setting, named
    `<name>-<param><value>-...` in the grid's order, its schedule given those params and `sweep`
    naming the grid arm; an empty grid or an empty list is refused naming the field."""
    if not isinstance(arms, list):
        return arms
    expanded: list[Any] = []
    for i, arm in enumerate(arms):
        if not isinstance(arm, dict) or "grid" not in arm:
            expanded.append(arm)
            continue
        grid, name, schedule = arm["grid"], arm.get("name"), arm.get("schedule")
        field = f"arms[{i}].grid"
        if not isinstance(grid, dict) or not grid:
            raise ValueError(
                f"{field} is empty: give each param a list of values, e.g. lam = [0.05]"
            )
        for param, values in grid.items():
            if not isinstance(values, list) or not values:
                raise ValueError(f"{field}.{param} is empty: list at least one value")
        if isinstance(schedule, str):
            schedule = {"kind": schedule}
        if not isinstance(schedule, dict):
            raise ValueError(f"{field}: the arm's schedule must be a table (kind = ...) to sweep")
        settings: list[list[tuple[str, Any]]] = [[]]
        for param, values in grid.items():
            settings = [[*s, (param, v)] for s in settings for v in values]
        rest = {k: v for k, v in arm.items() if k != "grid"}
        for setting in settings:
            label = "-".join(f"{param}{value:g}" if isinstance(value, float | int) else
                             f"{param}{value}" for param, value in setting)  # fmt: skip
            expanded.append(
                rest | {"name": f"{name}-{label}", "schedule": schedule | dict(setting),
                        "sweep": name}
            )  # fmt: skip
    return expanded


#: One unit group of ``prune.export``: an arm's name, "@", a keep fraction ("flap@0.5").
EXPORT_PATTERN = r"^[A-Za-z0-9_.-]+@(0?\.[0-9]+|1(\.0*)?)$"


#: ``export = ["best@KEEP"]``: the arm ``prune.select`` recommends at KEEP (no arm may take the
#: name).
BEST = "best"


def _export_unit(entry: str) -> tuple[str, float]:
    """``"ARM@KEEP"`` as (arm, keep)."""
    arm, _, keep = entry.rpartition("@")
    return arm, float(keep)


class PruneHeal(Section):
    """Fine-tuning every pruned model on the spec's training text in geospec's own engine (its
    weights imported: Llama-family checkpoints), then its held-out loss again."""

    steps: int = Field(0, ge=0, le=100_000_000)
    """Optimizer steps per pruned model (0: no healing)."""
    lr: float = Field(1e-4, gt=0.0, le=10.0)
    """Peak learning rate (cosine decay to a tenth, after warmup)."""
    warmup: int = Field(0, ge=0)
    batch_size: int = Field(8, ge=1, le=1_048_576)
    """Sequences of model.seq_len tokens per step."""
    weight_decay: float = Field(0.0, ge=0.0, le=10.0)
    distill: Annotated[float, ADDED_LATER] = Field(0.0, ge=0.0, le=1.0)
    """The share of distillation from the unpruned model in the healing loss: (1 - distill) x
    the next-token cross-entropy + distill x the KL divergence from the unpruned model's
    next-token distribution, per token (1: distillation alone, as Minitron heals; 0, the
    default: the cross-entropy alone)."""
    temperature: Annotated[float, ADDED_LATER] = Field(1.0, gt=0.0, le=100.0)
    """The distillation's softmax temperature T (its KL term is scaled by T^2)."""


PruneFraction = Annotated[float, Field(gt=0.0, le=1.0)]


class PruneSpec(Section):
    """Pruning the reference checkpoint's FFNs to a budget with every arm's allocation
    (docs/prune.md); `geospec prune` runs it."""

    keep: PruneFraction | list[PruneFraction] = 0.75
    """The share of the reference's FFN neurons kept (one fraction or a list), each in (0, 1]."""
    importance: ImportanceRef = Field({"kind": "activation"}, validate_default=True)
    """Which neurons a layer keeps at its width, and the scores flap and owl allocate from."""
    calibration: PruneCalibration = Field(default_factory=PruneCalibration)
    eval: PruneEval = Field(default_factory=PruneEval)
    arms: list[PruneArmSpec] = Field(min_length=1, max_length=1000)
    """The allocations compared: any schedule (solved at the pruned budget, no layer above its
    pretrained width) and the pruning allocations flap and owl; each may set its own
    importance and compensate."""
    baseline: Name = "uniform"
    """The arm every other is compared with, paired by calibration seed."""
    export: bool | list[Annotated[str, Field(pattern=EXPORT_PATTERN)]] = True
    """Write pruned models as checkpoints (at their true widths, docs/prune.md): true, every
    unit's; a list of `"ARM@KEEP"` (`["flap@0.5"]`), those units' only, every calibration seed
    (`"best@KEEP"`: the arm `select` recommends at KEEP, written once every unit is scored);
    false, none. A finished unit is exported without being computed again."""
    export_dtype: Annotated[
        Literal["checkpoint", "float32", "bfloat16", "float16"], ADDED_LATER
    ] = "checkpoint"
    """The dtype pruned models are written in: "checkpoint", the one the checkpoint's
    config.json declares (a bf16 checkpoint's export is as compact as it; a GGUF file declares
    none: reference.dtype), or the one named. Not part of what a unit computes: changing it
    writes the models again, nothing is recomputed."""
    heal: Annotated[PruneHeal, ADDED_LATER] = Field(default_factory=PruneHeal)
    """Fine-tune every pruned model (steps > 0) and measure it again (docs/prune.md)."""
    allocation_seeds: Annotated[bool, ADDED_LATER] = False
    """Calibration seed k also re-draws what the allocations are measured from: the probe's
    token sample (as probe.seed = k would draw it, from probe.calibration_split) and the
    measured profiles on it, so a geometric arm's widths move with the seed (docs/prune.md).
    false: every seed shares the run's profiles and only the neuron scores change."""
    repair: Annotated[RepairKind | None, ADDED_LATER] = None
    """What every arm's kept neurons become (an arm may set its own): "none" (the default), cut
    only; "mean", FLAP's bias compensation: each cut layer's output projection gains the bias
    sum over its removed neurons j of mean_j x W_out[:, j] (mean_j: neuron j's signed mean
    activation over the calibration sample), so a removed neuron contributes its calibration
    mean instead of zero; "lstsq", the output projection's kept columns and an intercept
    re-fitted by least squares to reproduce the unpruned FFN's output on the calibration text
    (`lstsq` sets how; docs/prune.md, "Repair")."""
    lstsq: Annotated[PruneLstsq, ADDED_LATER] = Field(default_factory=PruneLstsq)
    """The least-squares repair's damping, inputs and calibration windows."""
    compensate: Annotated[Literal["none", "mean"], ADDED_LATER] = "none"
    """Deprecated: repair's old name (`compensate = "mean"` is `repair = "mean"`)."""
    select: Annotated[PruneSelect | None, ADDED_LATER] = None
    """Recommend one arm per keep fraction, the one to ship, by its loss on held-out windows of
    the calibration corpus that nothing else reads (`{ windows = 8 }`; docs/prune.md, "What to
    ship"); `geospec prune --export best@KEEP` exports it. Omitted: no recommendation."""
    compute_dtype: Annotated[ComputeDtype, ADDED_LATER] = "float32"
    """The precision of every forward pass of the prune: calibration, scores, searches and each
    pruned model's held-out loss: "float32" (the default: exact, what the committed results were
    computed in), "bfloat16", "float16" (GPUs only), or "auto": bfloat16 where the hardware
    computes it natively (AVX512_BF16 or AMX on a CPU, a GPU that does), float32 elsewhere.
    Autocast over the weights as loaded (reference.dtype, unchanged); keys hold the dtype it
    resolves to, so float32 and bfloat16 results never mix (docs/prune.md, "Compute dtype and
    threads")."""

    @model_validator(mode="before")
    @classmethod
    def _grids(cls, data: Any) -> Any:
        if isinstance(data, dict) and "arms" in data:
            return {**data, "arms": _expanded_grids(data["arms"])}
        return data

    @property
    def fractions(self) -> list[float]:
        return self.keep if isinstance(self.keep, list) else [self.keep]

    @property
    def sweeps(self) -> dict[str, list[str]]:
        """Every grid's expanded arms, by the grid arm's name."""
        found: dict[str, list[str]] = {}
        for arm in self.arms:
            if arm.sweep is not None:
                found.setdefault(arm.sweep, []).append(arm.name)
        return found

    def arms_named(self, name: str) -> list[str]:
        """The arms ``name`` chooses (``geospec prune --arms``): the arm of that name, or every
        setting of the grid arm of that name (its expanded arms' names are spelled out)."""
        return [arm.name for arm in self.arms if name in (arm.name, arm.sweep)]

    def exports(self, keep: float, arm: str) -> bool:
        """Whether the units of ``arm`` at ``keep`` write their model as they are computed
        (``export``; a ``"best@KEEP"`` entry's arm is known only once every unit is:
        :meth:`best_exports`)."""
        if isinstance(self.export, bool):
            return self.export
        return any(_export_unit(entry) == (arm, keep) for entry in self.export)

    def best_exports(self) -> list[float]:
        """The keep fractions whose recommended arm's models ``export`` asks for
        (``"best@KEEP"``)."""
        if isinstance(self.export, bool):
            return []
        return [keep for arm, keep in map(_export_unit, self.export) if arm == BEST]

    def importance_of(self, arm: PruneArmSpec) -> ImportanceRef:
        """The importance table ``arm`` keeps its neurons by: its own, or the prune's."""
        return self.importance if arm.importance is None else arm.importance

    def repair_of(self, arm: PruneArmSpec) -> str:
        """What ``arm``'s kept neurons become: its own repair (or its deprecated compensate),
        else the prune's."""
        for setting in (arm.repair, arm.compensate, self.repair):
            if setting is not None:
                return setting
        return self.compensate

    def lstsq_of(self, arm: PruneArmSpec) -> PruneLstsq:
        """The least-squares repair settings of ``arm``: its own, or the prune's."""
        return self.lstsq if arm.lstsq is None else arm.lstsq

    def compensates(self, arm: PruneArmSpec) -> bool:
        """Whether ``arm``'s cut is bias-compensated by the calibration means ("mean")."""
        return self.repair_of(arm) == "mean"

    def refits(self, arm: PruneArmSpec) -> bool:
        """Whether ``arm``'s output projections are re-fitted by least squares ("lstsq")."""
        return self.repair_of(arm) == "lstsq"

    def biased(self, arm: PruneArmSpec) -> bool:
        """Whether ``arm``'s repair gives the output projections a bias (its export needs a
        family whose MLP carries one)."""
        repair = self.repair_of(arm)
        return repair == "mean" or (repair == "lstsq" and self.lstsq_of(arm).intercept)

    @model_validator(mode="after")
    def _repair_named_once(self) -> PruneSpec:
        compensate = None if "compensate" not in self.model_fields_set else self.compensate
        _deprecated_compensate("prune.", compensate, self.repair)
        return self

    @model_validator(mode="after")
    def _arms(self) -> PruneSpec:
        names = [arm.name for arm in self.arms]
        if len(set(names)) != len(names):
            raise ValueError(f"arm names must be distinct, got {names}")
        if self.baseline not in names:
            raise ValueError(f"baseline {self.baseline!r} is not one of the arms {names}")
        if len(set(self.fractions)) != len(self.fractions):
            raise ValueError(f"keep fractions must be distinct, got {self.fractions}")
        if BEST in names:
            raise ValueError(f"arm name {BEST!r} is taken: it names the recommended arm")
        for i, entry in enumerate(self.export if isinstance(self.export, list) else []):
            named, keep = _export_unit(entry)
            if named == BEST and self.select is None:
                raise ValueError(
                    f"export[{i}]: {entry!r} exports the arm select recommends; add select = "
                    '{ windows = 8 } (docs/prune.md, "What to ship") or name the arm'
                )
            if named not in [*names, BEST]:
                raise ValueError(f"export[{i}]: {entry!r} names no arm; the arms are {names}")
            if keep not in self.fractions:
                raise ValueError(
                    f"export[{i}]: {entry!r} names keep {keep:g}, which is not one of the keep "
                    f"fractions {self.fractions}"
                )
        return self


class EvalSpec(Section):
    """Downstream evaluation of every trained arm x seed with lm-evaluation-harness (the `eval`
    extra: pip install "geospec[eval]"), through its exported transformers checkpoint."""

    tasks: list[Annotated[str, Field(min_length=1)]] = Field(min_length=1)
    """lm-eval task, group or tag names: geospec_austen_lastword (bundled, offline), hub tasks
    such as hellaswag, arc_easy or lambada_openai (network or a filled datasets cache), or tasks
    defined in `include`."""
    include: list[str] = Field(default_factory=list)
    """Directories of lm-eval task YAMLs (relative to the spec file) defining further tasks."""
    limit: int | float | None = Field(None, gt=0)
    """Examples per task: a count (integer), or a fraction below 1 of each task's examples.
    Omit for all; a limited score is for a quick look, not for the paper."""
    num_fewshot: int | None = Field(None, ge=0)
    """Few-shot examples in each prompt (default: each task's own setting, usually 0)."""
    batch_size: int = Field(8, ge=1, le=65536)
    """Requests per forward pass. It does not change what is computed, so no key depends on it."""

    @model_validator(mode="after")
    def _fraction_or_count(self) -> EvalSpec:
        if isinstance(self.limit, float) and self.limit >= 1:
            raise ValueError(
                f"limit {self.limit}: a fraction must be below 1; give a count as an integer"
            )
        if len(set(self.tasks)) != len(self.tasks):
            raise ValueError("tasks must be unique")
        return self


#: The per-layer profiles the diagnose stage adds for the solver (schedules may name them when
#: [diagnose] is enabled): loss increase with the FFN scaled by (1 - eps) and removed (negative
#: changes clipped to 0), TwoNN intrinsic dimension, mean residual-stream norm.
DIAGNOSTIC_PROFILES = (
    "sensitivity/scale",
    "sensitivity/remove",
    "intrinsic_dimension/twonn",
    "residual_norm/mean",
)

#: The per-layer profiles the demand stage adds (when [demand] is enabled): the fitted lambda_l and
#: a_l, their product (the slope of the loss increase in ln(1/f) at full width, which the data pin
#: even where lambda and a alone are not), and the measured loss increase at each keep fraction
#: f, named ``demand/f<f>`` (:func:`demand_profile_names`).
DEMAND_PROFILES = ("demand/lambda", "demand/exponent", "demand/slope")


def demand_profile_names(demand: DemandSpec) -> tuple[str, ...]:
    """Every profile the demand stage of ``demand`` writes."""
    return (*DEMAND_PROFILES, *(f"demand/f{f:g}" for f in demand.keep))


def _all_means_none(value: object) -> object:
    if value == "all":
        return None
    if isinstance(value, str):
        raise ValueError(f'must be "all" or a list of [[measure]] tables, not {value!r}')
    return value


def _spec_schema(schema: dict[str, Any]) -> None:
    """The JSON Schema of a spec says what a spec of a pretrained reference.checkpoint may leave
    out: [model]'s shape (read from the checkpoint when the spec is loaded), [[arms]] where it
    prunes ([prune]: :meth:`Spec._pretrained_defaults`) and [train] where it trains nothing
    (probe_only, or a prune without arms); each is required otherwise."""
    schema["required"] = [name for name in schema.get("required", []) if name not in ARMS_TRAIN]
    model = schema.get("$defs", {}).get("ModelSpec", {})
    shape = [name for name in model.get("required", []) if name != "seq_len"]
    model["required"] = [name for name in model.get("required", []) if name not in shape]
    pretrained = {
        "properties": {"reference": {"required": ["checkpoint"]}},
        "required": ["reference"],
    }
    probe_only = {"properties": {"probe_only": {"const": True}}, "required": ["probe_only"]}
    schema["allOf"] = [
        {"if": {"not": pretrained}, "then": {"properties": {"model": {"required": shape}}}},
        {"if": {"not": {"required": ["prune"]}}, "then": {"required": ["arms"]}},
        {
            "if": {"not": {"anyOf": [probe_only, {"required": ["prune"]}]}},
            "then": {"required": ["train"]},
        },
    ]


#: What a spec of a pretrained checkpoint may leave out (:func:`_spec_schema`).
ARMS_TRAIN = ("arms", "train")


class Spec(Section):
    """A whole experiment."""

    name: Name
    out: str | None = None
    """Run directory (default runs/<name>), relative to the current directory."""
    plugins: list[Annotated[str, Field(min_length=1, max_length=4096)]] = Field(
        default_factory=list, max_length=100
    )
    """Python files whose @geospec.hookimpl hooks register plugins, as an installed package's
    entry point does (a quick experiment without a package); relative to the spec file."""
    model: ModelSpec
    data: DataSpec = Field(default_factory=DataSpec)
    reference: ReferenceSpec = Field(default_factory=ReferenceSpec)
    probe: ProbeSpec = Field(default_factory=ProbeSpec)
    measure: Annotated[list[MeasureSpec] | None, BeforeValidator(_all_means_none)] = None
    """A list of geometry x statistic tables, or "all" (the default): every registered pair; in a
    spec that only prunes ([prune] without [[arms]]), every pair its [prune] arms read."""
    arms: list[ArmSpec] = Field(max_length=1000)
    """The trained schedules: at least one, except in a spec that only prunes a
    reference.checkpoint ([prune] without [[arms]]: nothing is trained)."""
    train: TrainSpec
    report: ReportSpec = Field(default_factory=ReportSpec)
    diagnose: DiagnoseSpec = Field(default_factory=DiagnoseSpec)
    demand: Annotated[DemandSpec, ADDED_LATER] = Field(default_factory=DemandSpec)
    """Measured demand of the reference ([demand] enabled = true): a stage between diagnose and
    solve whose profiles (demand/lambda, demand/exponent, demand/f0.5, ...) schedules can read."""
    probe_only: bool = False
    """Train no arm: `geospec run` probes, measures, diagnoses, solves and reports (for pretrained
    checkpoints, whose own shape is not trained here; with a reference.checkpoint, [train] may be
    left out)."""
    eval: Annotated[EvalSpec | None, ADDED_LATER] = None
    """Evaluate every trained arm x seed on lm-eval tasks (a stage between train and report;
    scores and their paired comparison go into results.json and report.md). Absent: no
    evaluation."""
    prune: Annotated[PruneSpec | None, ADDED_LATER] = None
    """Prune the reference checkpoint to budgets with every [prune] arm's allocation (a stage
    after solve, run by `geospec prune`). Absent: no pruning."""
    launch: Annotated[LauncherRef | None, ADDED_LATER] = None
    """Where the arm-seed runs are trained: a launcher table such as { kind = "pool", workers = 4 }
    (`geospec plugins` lists them). Absent: { kind = "local" }, one run after another in this
    process. It never changes what a run computes, so no key depends on it."""

    @classmethod
    def model_json_schema(cls, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Pydantic's schema, with what a spec of a pretrained checkpoint may leave out
        (:func:`_spec_schema`)."""
        schema = super().model_json_schema(*args, **kwargs)
        _spec_schema(schema)
        return schema

    @model_validator(mode="before")
    @classmethod
    def _pretrained_defaults(cls, data: Any) -> Any:
        """What a spec of a pretrained reference.checkpoint may leave out.

        - data.tokenizer: the checkpoint's own (the probe and the prune must feed the model its
          own tokens), as if the spec named it, so a spec that names it keeps its keys.
        - [[arms]] in a spec that prunes it ([prune]): nothing is trained (probe_only).
        - [train] in a probe-only spec: its device and threads take their defaults; steps is a
          placeholder nothing reads. A spec whose reference is trained here still needs it."""
        if not isinstance(data, dict):
            return data
        reference = data.get("reference")
        checkpoint = reference.get("checkpoint") if isinstance(reference, dict) else None
        if not isinstance(checkpoint, str) or not checkpoint:
            return data
        assert isinstance(reference, dict)
        data = dict(data)
        table = data.get("data", {})
        if isinstance(table, dict) and "tokenizer" not in table:
            tokenizer: dict[str, Any] = {"kind": "pretrained", "path": checkpoint}
            revision = reference.get("revision")
            if isinstance(revision, str) and COMMIT.match(revision):  # else its own line says why
                tokenizer["revision"] = revision
            if reference.get("trust_remote_code") is True:
                tokenizer["trust_remote_code"] = True
            data["data"] = {**table, "tokenizer": tokenizer}
        if "prune" in data and "arms" not in data:
            data["arms"] = []
            data.setdefault("probe_only", True)
        if data.get("probe_only") is True and "train" not in data:
            data["train"] = {"steps": 1}
        return data

    @model_validator(mode="before")
    @classmethod
    def _prune_calibrates_on_train(cls, data: Any) -> Any:
        """The one place the calibration split's default is decided: "train" in a spec with
        [prune] (whatever sets a width must never see an eval window), unless
        probe.calibration_split says otherwise; "val" (the field's default) elsewhere, so that
        no training study's key changes."""
        if not isinstance(data, dict) or data.get("prune") is None:
            return data
        probe = data.get("probe", {})
        if isinstance(probe, dict) and "calibration_split" not in probe:
            return {**data, "probe": {**probe, "calibration_split": "train"}}
        if isinstance(probe, ProbeSpec) and "calibration_split" not in probe.model_fields_set:
            return {**data, "probe": probe.model_copy(update={"calibration_split": "train"})}
        return data

    @property
    def run_dir(self) -> str:
        return self.out or f"runs/{self.name}"
