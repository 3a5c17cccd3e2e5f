"""What only the files a spec names can tell, checked before anything is loaded: the pretrained
checkpoint's positions, FFN layout and vocabulary against the spec (a GGUF file's size against
its tensors too), the prune's eval corpora, and the memory loading the checkpoint takes on this
machine.

Each would otherwise stop a run after the reference is loaded and probed (or end in a traceback
deep in a forward pass); here each is one line naming the field and the fix. Torch-free:
``geospec validate`` runs it, reading config.json, GGUF metadata and tokenizer.json as files.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from geospec.data.bundled import BUNDLED_PREFIX, bundled_names
from geospec.hub import spec_path
from geospec.spec.checkpoint_shape import (
    CheckpointFacts,
    gguf_data_problem,
    read_checkpoint_facts,
)
from geospec.spec.sections import PretrainedTokenizer, PruneArmSpec, PruneSpec, Spec

#: Families whose FFN geospec's cut (geospec.measure.cut) cannot remove neurons from, by
#: config.json model_type and GGUF architecture, with what their FFN is instead. The cut handles
#: gated MLPs with separate gate_proj/up_proj/down_proj and GPT-2's c_fc/c_proj.
UNCUTTABLE = {
    "phi3": "fuses the gate and up projections into one gate_up_proj",
    "phi": "is fc1/fc2",
    "phi2": "is fc1/fc2",
    "gpt_neox": "is dense_h_to_4h/dense_4h_to_h",
    "gptneox": "is dense_h_to_4h/dense_4h_to_h",
    "falcon": "is dense_h_to_4h/dense_4h_to_h",
    "bloom": "is dense_h_to_4h/dense_4h_to_h",
    "gptj": "is fc_in/fc_out beside the attention (a parallel block)",
    "opt": "is fc1/fc2 in the decoder layer itself",
    "starcoder2": "is c_fc/c_proj as linear layers",
}
CUTTABLE = (
    "geospec cuts gated MLPs with separate gate_proj/up_proj/down_proj (Llama, Mistral, Qwen2, "
    "Gemma 2, SmolLM2) and GPT-2's c_fc/c_proj"
)


def file_problems(spec: Spec, spec_dir: Path) -> list[str]:
    """Problems of ``spec`` against the files it names (``field: message`` lines; empty when
    sound). The checkpoint's own readability is checked where [model] is filled from it."""
    problems = _corpus_problems(spec, spec_dir)
    checkpoint = spec.reference.checkpoint
    if checkpoint is None:
        return problems
    if (extra := _gguf_extra_problem(checkpoint)) is not None:
        problems.append(extra)
    if (incomplete := _gguf_problem(spec, spec_dir)) is not None:
        problems.append(incomplete)
        return problems
    facts = read_checkpoint_facts(checkpoint, spec.reference.revision, spec_dir)
    if facts is None:
        return problems
    if facts.positions is not None and spec.model.seq_len > facts.positions:
        problems.append(
            f"model.seq_len: {spec.model.seq_len} is beyond the checkpoint's "
            f"{facts.positions} positions ({facts.positions_key} in {facts.described}); "
            f"lower it to at most {facts.positions}"
        )
    cuts = spec.prune is not None or spec.demand.enabled
    if cuts and (layout := _layout_problem(facts)) is not None:
        uses = "[prune]" if spec.prune is not None else "[demand]"
        problems.append(f"reference.checkpoint: {uses} cannot cut {layout}")
    if (vocabulary := _vocabulary_problem(spec, spec_dir, facts)) is not None:
        problems.append(vocabulary)
    if (shipping := _shipped_scoring_problem(spec, spec_dir, facts)) is not None:
        problems.append(shipping)
    from geospec.shapes.memory import host_available

    if (repair := repair_memory_problem(spec, host_available())) is not None:
        problems.append(repair)
    return problems


def repair_memory_problem(spec: Spec, free: int | None) -> str | None:
    """A least-squares repair that cannot fit in the ``free`` bytes this machine has left
    (:mod:`geospec.shapes.repair`): said before the checkpoint is loaded."""
    from geospec.spec.summary import repair_estimates

    if free is None:
        return None
    for arms, estimate in repair_estimates(spec).items():
        if estimate.total > free:
            fix = (
                'search cut levels (repair = "none" on the evolve arm) or use a larger machine'
                if estimate.levels
                else 'set prune.lstsq.inputs = "sequential" (one layer\'s moments at a time)'
                if estimate.inputs == "unpruned"
                else "lower prune.lstsq.windows or model.seq_len, or use a larger machine"
            )
            return (
                f"prune.lstsq: the repair of {arms} needs {estimate.describe()}; {_free(free)}; "
                f"{fix}"
            )
    return None


def _free(free: int) -> str:
    from geospec.storage.disk import size

    return f"this machine has {size(free)} free"


#: What transformers needs to read a GGUF file, beyond geospec's own dependencies: the gguf
#: extra (its reader, and accelerate, which transformers' GGUF loading imports).
GGUF_EXTRA = ("gguf", "accelerate")


def _gguf_extra_problem(checkpoint: str) -> str | None:
    """The line for a GGUF checkpoint whose loading would fail on a missing package (validate
    says it, not the prune's first load), or None."""
    import importlib.util

    if not checkpoint.endswith(".gguf"):
        return None
    missing = [name for name in GGUF_EXTRA if importlib.util.find_spec(name) is None]
    if not missing:
        return None
    return (
        f"reference.checkpoint: reading {checkpoint} needs {' and '.join(missing)}, which are "
        'not installed: pip install "geospec[gguf]"'
    )


def _gguf_problem(spec: Spec, spec_dir: Path) -> str | None:
    """A local GGUF checkpoint that cannot hold its own tensors: a truncated file's header reads
    fine, and its loader would fail later with a traceback."""
    local = spec_path(spec.reference.checkpoint or "", spec_dir)
    if spec.reference.revision is not None or not (local.is_file() and local.suffix == ".gguf"):
        return None
    problem = gguf_data_problem(local)
    return None if problem is None else f"reference.checkpoint: {local}: {problem}"


#: Families (config.json model_type, GGUF architecture) whose transformers MLP has no bias
#: option: their projections are built without one whatever the config says, so a repaired
#: cut's down-projection bias cannot go into their padded checkpoint, which plain
#: ``AutoModelForCausalLM`` reads (what geospec.prune.hf_export.compensated_export_problem finds
#: on the loaded model). The true-width export (geospec.load_pruned gives the projection its
#: bias) and the GGUF file (llama.cpp's deci reads an optional ffn_down.bias) carry it.
NO_MLP_BIAS = ("mistral", "qwen2", "gemma", "gemma2", "gemma3", "gemma3_text")
#: Families the GGUF writer (geospec.prune.gguf_export) maps to llama.cpp's ``deci``
#: architecture, whose loader reads every attention and FFN bias as an optional tensor.
GGUF_FAMILIES = ("llama", "mistral", "qwen2")


def _shipped_scoring_problem(spec: Spec, spec_dir: Path, facts: CheckpointFacts) -> str | None:
    """``prune.select.shipped`` writes every arm's GGUF file (where the reference is a GGUF file
    of a type this machine writes); a family the GGUF writer does not map has none, so the
    recommendation could never be made: said here, not after every unit."""
    import importlib.util

    from geospec.spec.width_grid import K_QUANTS, gguf_file_type

    prune = spec.prune
    if prune is None or prune.select is None or not prune.select.shipped:
        return None
    if facts.family in GGUF_FAMILIES:
        return None
    local = spec_path(spec.reference.checkpoint or "", spec_dir)
    if spec.reference.revision is not None or local.suffix != ".gguf" or not local.is_file():
        return None  # no GGUF file is written: the float32 models recommend
    dtype = gguf_file_type(local)
    if dtype is None or (dtype in K_QUANTS and importlib.util.find_spec("llama_cpp") is None):
        return None  # none is written here either (docs/prune.md, "What to ship")
    return (
        f"prune.select.shipped: every arm's GGUF file is written and scored, but the GGUF "
        f"writer maps {', '.join(GGUF_FAMILIES)} (llama.cpp's deci), not {facts.family} "
        f"({facts.described}); set select.shipped = false (the float32 models recommend)"
    )


def _names(arms: Sequence[PruneArmSpec], joined: str = ", ") -> str:
    return joined.join(arm.name for arm in arms)


def biased_arms(prune: PruneSpec) -> list[PruneArmSpec]:
    """The arms whose repair adds a bias to the output projection (:meth:`PruneSpec.biased`)."""
    return [arm for arm in prune.arms if prune.biased(arm)]


def no_bias_reason(facts: CheckpointFacts) -> str:
    """Why a family of :data:`NO_MLP_BIAS` cannot hold a repaired model in a padded checkpoint
    (and where it was read)."""
    return (
        f"transformers' {facts.family} MLP has no bias to carry the repair's in a padded "
        f"checkpoint ({facts.described})"
    )


def bias_fix(prune: PruneSpec, arms: Sequence[PruneArmSpec]) -> str:
    """What makes ``arms`` exportable padded on a family without an MLP bias: the true widths or
    a GGUF file, which carry the bias; or the re-fit without its intercept (the kept columns
    alone), or no mean compensation."""
    repairs = {prune.repair_of(arm) for arm in arms}
    fixes = ["leave --padded out (the true-width directory, which geospec.load_pruned reads, and "
             "--format gguf carry the bias)"]  # fmt: skip
    if "lstsq" in repairs:
        fixes.append("re-fit without an intercept (lstsq = { intercept = false }, in [prune] or "
                     "on the arm)")  # fmt: skip
    if "mean" in repairs:
        fixes.append('re-fit the mean-compensated arms instead (repair = "lstsq" with lstsq = '
                     '{ intercept = false }) or cut them only (repair = "none")')  # fmt: skip
    return "; or ".join(fixes)


def no_bias_facts(spec: Spec, spec_dir: Path) -> CheckpointFacts | None:
    """The reference checkpoint's facts where its family's MLP has no bias (Qwen2, Mistral,
    Gemma) and the prune has an arm whose repair adds one; None otherwise (or unreadable)."""
    prune, checkpoint = spec.prune, spec.reference.checkpoint
    if prune is None or checkpoint is None or not biased_arms(prune):
        return None
    facts = read_checkpoint_facts(checkpoint, spec.reference.revision, spec_dir)
    return facts if facts is not None and facts.family in NO_MLP_BIAS else None


def export_option_problem(spec: Spec, spec_dir: Path, option: str, arm: str) -> str | None:
    """``geospec prune --export ARM@KEEP --padded`` (``option``) of a repaired arm whose bias
    the checkpoint's family's transformers MLP cannot hold: the padded checkpoint can never be
    written (one line, said before the prune runs), or None."""
    facts = no_bias_facts(spec, spec_dir)
    prune = spec.prune
    if facts is None or prune is None:
        return None
    biased = [found for found in biased_arms(prune) if found.name == arm]
    if not biased:
        return None
    return (
        f"{option}: {arm}'s repair ({prune.repair_of(biased[0])!r}) adds a bias to "
        f"the FFN output projection, but {no_bias_reason(facts)}; {bias_fix(prune, biased)} in "
        "the spec, or export an unrepaired arm"
    )


def bias_export_warnings(spec: Spec, spec_dir: Path, asked: str) -> list[str]:
    """What ``asked`` (``--export best@KEEP --padded``) may not write, said before the prune
    runs (the prune still computes and scores every unit): the padded checkpoint of the
    recommended model, when the recommendation could be an arm whose repair adds a bias the
    family's transformers MLP cannot hold. An explicit ``--export ARM@KEEP --padded`` of such an
    arm is refused instead (:func:`export_option_problem`)."""
    prune = spec.prune
    facts = no_bias_facts(spec, spec_dir)
    if prune is None or prune.select is None or facts is None:
        return []
    arms = biased_arms(prune)
    return [
        f"prune.select: if the recommended arm is {_names(arms, ' or ')} (a repair that adds a "
        f"bias to the FFN output projection), {asked} fails: {no_bias_reason(facts)}; "
        f"{bias_fix(prune, arms)}"
    ]


def _layout_problem(facts: CheckpointFacts) -> str | None:
    """The FFN neurons of this checkpoint geospec's cut cannot remove, said as ``the FFN of
    <family>: why (where it was read); what geospec cuts``, or None."""
    named = facts.family or "?"
    if facts.architectures:
        named += f" ({', '.join(facts.architectures)})"
    if facts.experts:
        why = f"a mixture of {facts.experts} experts, not one FFN"
    elif facts.family in UNCUTTABLE:
        why = f"it {UNCUTTABLE[facts.family]}"
    else:
        return None
    return f"the FFN of {named}: {why} ({facts.described}); {CUTTABLE}"


def tokenizer_vocabulary(directory: Path) -> int | None:
    """The number of token ids a tokenizer directory's tokenizer.json defines (its largest id
    plus one, added tokens included), or None without a readable tokenizer.json."""
    try:
        tokenizer = json.loads((directory / "tokenizer.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(tokenizer, dict):
        return None
    vocab = (tokenizer.get("model") or {}).get("vocab")
    ids: list[int] = []
    if isinstance(vocab, dict):
        ids += [i for i in vocab.values() if isinstance(i, int)]
    elif isinstance(vocab, list):  # Unigram: [piece, score] pairs, ids by position
        ids.append(len(vocab) - 1)
    ids += [t["id"] for t in tokenizer.get("added_tokens") or () if isinstance(t.get("id"), int)]
    return max(ids) + 1 if ids else None


def _vocabulary_problem(spec: Spec, spec_dir: Path, facts: CheckpointFacts) -> str | None:
    tokenizer = spec.data.tokenizer
    if not isinstance(tokenizer, PretrainedTokenizer) or tokenizer.revision is not None:
        return None
    directory = spec_path(tokenizer.path, spec_dir)
    model_vocab = spec.model.vocab_size or facts.vocab_size
    defined, read = None, "tokenizer.json"
    if directory.is_dir():
        defined = tokenizer_vocabulary(directory)
    elif directory.is_file() and directory.suffix == ".gguf":
        defined, read = _gguf_tokens(directory), "tokenizer.ggml.tokens"
    if model_vocab is None or defined is None or defined <= model_vocab:
        return None
    own = spec_path(spec.reference.checkpoint or "", spec_dir) == directory
    fix = (
        "the checkpoint's own tokenizer does not fit its own model; fix its files"
        if own
        else "use the checkpoint's own tokenizer (leave data.tokenizer out)"
    )
    return (
        f"data.tokenizer.path: the tokenizer in {directory} has {defined:,} token ids "
        f"({read}), more than the checkpoint's vocab_size {model_vocab:,} "
        f"({facts.described}): ids from {model_vocab:,} on have no embedding; {fix}"
    )


def _gguf_tokens(path: Path) -> int | None:
    """How many tokens a GGUF file's embedded tokenizer has, or None where it does not say."""
    from geospec.spec.checkpoint_shape import GGUFFormatError, read_gguf_header

    try:
        metadata, _ = read_gguf_header(path)
    except (GGUFFormatError, OSError):
        return None
    tokens = metadata.get("tokenizer.ggml.tokens")  # a string array, given as its length
    return tokens if isinstance(tokens, int) else None


def _corpus_problems(spec: Spec, spec_dir: Path) -> list[str]:
    """A ``bundled:`` name that is no bundled corpus ([data]'s source, an eval corpus), and eval
    corpora of [prune] that name a file (relative to the spec file) that is not there."""
    names = bundled_names()
    known = ", ".join(names)
    problems = []
    if (source := spec.data.corpus or "").startswith(BUNDLED_PREFIX) and source not in names:
        problems.append(f"data.source: no bundled corpus {source!r}; the bundled ones: {known}")
    if spec.prune is None:
        return problems
    for i, corpus in enumerate(spec.prune.eval.corpora):
        if corpus.startswith(BUNDLED_PREFIX) and corpus not in names:
            problems.append(
                f"prune.eval.corpora[{i}]: no bundled corpus {corpus!r}; the bundled ones: {known}"
            )
        if corpus.startswith(BUNDLED_PREFIX) or corpus == spec.data.source:
            continue
        path = spec_path(corpus, spec_dir)
        if not path.exists():
            problems.append(
                f"prune.eval.corpora[{i}]: {path} does not exist; give a .txt or .jsonl file "
                f"(relative to the spec file) or a bundled corpus ({known})"
            )
    return problems


#: Bytes per weight as the checkpoint is loaded (reference.dtype).
def _autocast_copies(spec: Spec) -> int:
    """Bytes per weight that autocast adds while a stage computes in a narrower dtype than the
    weights' float32: torch keeps one cast copy of every weight it has cast until the stage's
    block ends (2 for bfloat16 or float16, 0 otherwise)."""
    from geospec.hardware import cpu_computes_bf16

    if spec.reference.dtype != "float32":
        return 0
    requested = {spec.probe.compute_dtype, spec.diagnose.compute_dtype, spec.demand.compute_dtype}
    if spec.prune is not None:
        requested.add(spec.prune.compute_dtype)
    narrow = requested & {"bfloat16", "float16"} or ("auto" in requested and cpu_computes_bf16())
    return 2 if narrow else 0


def loading_memory_problem(spec: Spec) -> str | None:
    """Why this machine cannot hold the pretrained checkpoint's weights (one line naming
    reference.dtype and the fixes), or None: where it fits, where the weights go to a GPU (whose
    free memory only torch can tell), where [model]'s size is unknown, or with
    GEOSPEC_SKIP_MEMORY_CHECK=1."""
    from geospec.shapes.memory import DTYPE_BYTES, host_available
    from geospec.shapes.model_size import count_params
    from geospec.spec.resolve import declared_vocab_size, model_shape

    if spec.reference.checkpoint is None or os.environ.get("GEOSPEC_SKIP_MEMORY_CHECK") == "1":
        return None
    if not _loads_on_host(spec.train.device):
        return None
    vocab = declared_vocab_size(spec)
    if vocab is None:
        return None
    m = spec.model
    params = count_params(model_shape(spec, vocab), [m.ffn_width] * m.n_layers)
    dtype = spec.reference.dtype
    weights = params * DTYPE_BYTES[dtype]
    # exporting a pruned model builds its padded copy beside the reference
    copies = 2 if spec.prune is not None and spec.prune.export else 1
    cast = params * _autocast_copies(spec)
    free = host_available()
    if free is None or weights * copies + cast <= free:
        return None
    from geospec.storage.disk import size

    needs = f"{size(weights * copies + cast)} ({params:,} parameters in {dtype}"
    if copies == 2:
        needs += ", twice: the reference and a pruned copy while it is exported"
    if cast:
        needs += ", and autocast's bfloat16 copy of them (compute_dtype)"
    needs += ")"
    fixes = ['set reference.dtype = "bfloat16" (half)'] if dtype == "float32" else []
    if cast:
        fixes.append('set compute_dtype = "float32" (no copy)')
    if copies == 2:
        fixes.append("set prune.export = false")
    fixes.append("run where more memory is free (GEOSPEC_SKIP_MEMORY_CHECK=1 skips this check)")
    return (
        f"reference.dtype: loading {spec.reference.checkpoint} needs at least {needs}, and this "
        f"machine has {size(free)} free; " + "; ".join(fixes)
    )


def _loads_on_host(device: str) -> bool:
    """Whether the reference's weights land in host memory: on the CPU (or Apple's unified
    memory), and under "auto" on a machine without an NVIDIA GPU."""
    if device == "auto":
        gpus = Path("/proc/driver/nvidia/gpus")
        return not (gpus.is_dir() and any(gpus.iterdir()))
    return not device.startswith("cuda")
