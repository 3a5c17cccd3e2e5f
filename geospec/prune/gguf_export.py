"""A pruned (or trained) Llama-family model as a GGUF file that an unmodified llama.cpp loads with
its true per-layer FFN widths.

llama.cpp's ``llama`` architecture builds every layer's FFN at one width; its ``deci``
architecture (written for NVIDIA's Nemotron-NAS models, src/models/deci.cpp) reads
``deci.feed_forward_length`` as a per-layer array (``hparams.n_ff(i)``) and creates each layer's
``ffn_gate``/``ffn_up``/``ffn_down`` at that width; with every layer's attention intact it
computes exactly what ``llama`` does (rmsnorm, rotary attention of the same type, a SwiGLU FFN).
The file is written as llama.cpp's own converter writes a Llama (convert_hf_to_gguf.py's
``DeciModel`` and ``LlamaModel``): the same keys and tensor names, the query and key projections
permuted from transformers' rotate-half order to llama.cpp's interleaved pairs, norms in f32,
the token embedding reused as the output when the embeddings are tied.

Biases: deci's loader creates every attention and FFN bias as an optional tensor (src/
llama-model.cpp, ``case LLM_ARCH_DECI``: ``bq``/``bk``/``bv``/``bo`` and ``ffn_gate_b``/
``ffn_up_b``/``ffn_down_b``, ``TENSOR_NOT_REQUIRED``) and its graph adds each one it has
(src/models/deci.cpp). So Qwen2 (its query, key and value projections have biases; transformers'
rotate-half rope like Llama's, so its query and key rows and biases are permuted alike) is
written as deci too, and so is a repair's bias on the FFN's down projection (mean compensation,
the least-squares re-fit's intercept) as ``blk.N.ffn_down.bias``, on every family written here:
transformers' Qwen2 and Mistral MLPs are built without one, but the true-width directory the
file is written from stores it and :func:`geospec.load_pruned` gives it back. (llama.cpp's
``gemma3`` loader creates no FFN bias, and Gemma is not written here.)

The tokenizer goes in with the weights: copied field by field from a GGUF file (a model pruned
from SmolLM2's GGUF keeps that file's vocabulary, merges, special tokens and chat template), or
built from a byte-level BPE ``tokenizer.json`` (GPT-2's, SmolLM's and Qwen2's pre-tokenizers, as
llama.cpp's ``gpt2`` tokenizer model reads them; the special tokens and chat template through
gguf-py's ``SpecialVocab``). ``gguf`` (the ``gguf`` extra) is imported only inside the functions.

Weight types (:mod:`geospec.prune.gguf_quant`): f32 and f16 are written here; a quantized type
through llama.cpp's own quantizer where llama-cpp-python is installed (the model written in f32
to a temporary file beside the target, quantized into the target), else gguf-py's numpy
quantizer for the legacy types, with llama.cpp's rules for the output matrix and for rows that do
not split into blocks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from geospec.errors import UsageError
from geospec.prune.gguf_quant import DTYPES as DTYPES  # the types written, where they were
from geospec.prune.gguf_quant import GGUF_PY, check_dtype, file_type, main_type, quantizer
from geospec.spec.file_checks import GGUF_FAMILIES

ARCH = "deci"
#: transformers model types the writer maps to llama.cpp's deci (Llama's layer, its optional
#: biases included: Qwen2's), as validate knows them.
FAMILIES = GGUF_FAMILIES


@dataclass(frozen=True)
class Written:
    """What :func:`write_gguf` wrote."""

    path: Path
    widths: list[int]
    dtype: str
    """The file's weight type (a ``--dtype``: f16, q4_1, q4_k_m)."""
    parameters: int
    """Parameters in the file (a tied embedding once)."""
    bytes: int
    quantizer: str
    """Who wrote the weights: gguf-py, or llama.cpp's quantizer."""


def write_gguf(
    source: Path | Any,
    path: Path,
    dtype: str = "f16",
    tokenizer: Path | None = None,
    name: str | None = None,
) -> Written:
    """Write ``source`` as the GGUF file ``path`` (atomically: a temporary file renamed into place).

    ``source``: a directory geospec exported (read with :func:`geospec.load_pruned`; its own
    tokenizer.json is the default tokenizer) or a transformers model object (its MLPs at any
    widths: cut, loaded by ``load_pruned``, or padded with zero units, which are written as they
    are). ``tokenizer``: a ``.gguf`` file whose tokenizer fields are copied, or a directory holding
    ``tokenizer.json``. ``dtype``: one of :data:`DTYPES` for the matrices (norms and biases
    stay f32); a quantized type is written by llama.cpp's quantizer where llama-cpp-python is
    installed, else by gguf-py (a K-quant without llama-cpp-python is one line)."""
    from geospec.prune.true_width import load_pruned
    from geospec.storage.atomic import atomic_path

    dtype = check_dtype(dtype)
    writes = quantizer(dtype)
    gguf = _import_gguf()
    directory = Path(source) if isinstance(source, (str, Path)) else None
    if directory is not None:
        if tokenizer is None and (directory / "tokenizer.json").is_file():
            tokenizer = directory
        model: Any = load_pruned(directory, dtype=torch.float32)
    else:
        model = source
    config = model.config
    _check_family(model)
    if tokenizer is None:
        raise UsageError(
            f"{directory or type(model).__name__}: no tokenizer to write into the GGUF file; give "
            "--tokenizer (a .gguf file, or a directory with tokenizer.json)"
        )
    vocab_size = int(model.get_input_embeddings().weight.shape[0])
    tensors, widths = _tensors(model)
    path = Path(path)
    contents = _Contents(config, tensors, widths, vocab_size, tokenizer, name or path.stem)
    with atomic_path(path) as tmp:
        if writes == GGUF_PY:
            _write(tmp, contents, dtype, gguf)
        else:
            from geospec.hardware import available_cores
            from geospec.prune.gguf_quant import quantize_file, scratch_beside

            # llama.cpp quantizes from the f32 weights themselves (no f16 rounding first)
            with scratch_beside(path) as unquantized:
                _write(unquantized, contents, "f32", gguf)
                quantize_file(unquantized, tmp, dtype, available_cores())
    parameters = sum(tensor.size for _, tensor in tensors)
    return Written(path, widths, dtype, parameters, path.stat().st_size, writes)


@dataclass(frozen=True)
class _Contents:
    """What a file holds whatever its weight type."""

    config: Any
    tensors: list[tuple[str, np.ndarray]]
    widths: list[int]
    vocab_size: int
    tokenizer: Path
    name: str


def _write(path: Path, contents: _Contents, dtype: str, gguf: Any) -> None:
    """``contents`` as the GGUF file ``path`` with gguf-py, matrices in ``dtype``."""
    writer = gguf.GGUFWriter(str(path), ARCH)
    writer.add_name(contents.name)
    _hyperparameters(writer, contents.config, contents.widths, contents.vocab_size, dtype, gguf)
    _tokenizer(writer, contents.tokenizer, contents.vocab_size, gguf)
    writer.add_array("geospec.ffn_widths", contents.widths)
    names = {tensor_name for tensor_name, _ in contents.tensors}
    # llama.cpp's quantizer treats the output matrix apart, and a tied embedding as that matrix
    output = "output.weight" if "output.weight" in names else "token_embd.weight"
    for tensor_name, tensor in contents.tensors:
        _add_tensor(writer, tensor_name, tensor, dtype, tensor_name == output, gguf)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _import_gguf() -> Any:
    try:
        import gguf
    except ImportError:
        raise UsageError(
            "--format gguf needs the gguf library: pip install 'geospec[gguf]'"
        ) from None
    return gguf


def _check_family(model: Any) -> None:
    """Llama's decoder layer exactly, or one line naming what is not mapped and the fix."""
    config = model.config
    kind = getattr(config, "model_type", type(model).__name__)
    heads = getattr(config, "num_attention_heads", 0)
    problem = None
    rope = _rope(config)
    if kind not in FAMILIES:
        problem = f"its family {kind!r} is not mapped"
    elif getattr(config, "sliding_window", None) not in (None, 0):
        problem = "its sliding-window attention is not mapped"
    elif _has_bias(model, "q_proj") and _head_dim(config) * heads != config.hidden_size:
        # deci's loader builds the query bias hidden_size wide (n_embd), not heads x head size
        problem = "its query bias is not hidden_size wide (heads x head size differs)"
    elif getattr(config, "hidden_act", "silu") != "silu":
        problem = f"its activation {config.hidden_act!r} is not SwiGLU's silu"
    elif rope.get("rope_type", "default") not in ("default", None):
        problem = f"its RoPE scaling {rope.get('rope_type')!r} is not mapped"
    if problem is not None:
        raise UsageError(
            f"{type(model).__name__}: {problem}; the GGUF writer maps Llama-family models "
            f"({', '.join(FAMILIES)}: rmsnorm, SwiGLU, plain RoPE) to llama.cpp's "
            "deci architecture; export this one with --format hf"
        )


def _has_bias(model: Any, name: str) -> bool:
    """Whether the first layer's attention projection ``name`` has a bias."""
    return getattr(getattr(model.model.layers[0].self_attn, name), "bias", None) is not None


def _rope(config: Any) -> dict[str, Any]:
    """RoPE's type and theta: transformers 5's ``rope_parameters``, or 4.x's attributes."""
    parameters = getattr(config, "rope_parameters", None)
    if isinstance(parameters, dict) and parameters:
        return dict(parameters)
    scaling = getattr(config, "rope_scaling", None) or {}
    return {
        "rope_type": scaling.get("rope_type", scaling.get("type", "default")),
        "rope_theta": getattr(config, "rope_theta", 10000.0),
    }


def _head_dim(config: Any) -> int:
    return int(
        getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    )


def _hyperparameters(
    writer: Any, config: Any, widths: list[int], vocab: int, dtype: str, gguf: Any
) -> None:
    """The keys llama.cpp's deci loader reads (as convert_hf_to_gguf.py writes a Llama)."""
    head_dim = _head_dim(config)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(widths)  # per layer: deci reads hparams.n_ff(i)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(
        getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    )
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(float(_rope(config).get("rope_theta", 10000.0)))
    writer.add_rope_dimension_count(head_dim)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_vocab_size(vocab)
    writer.add_file_type(file_type(dtype, gguf))
    if dtype not in ("f32", "f16"):
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)  # as llama.cpp's converter does


def gguf_parameters(model: Any) -> list[tuple[str, torch.Tensor, int | None]]:
    """Every tensor of a Llama-family ``model`` under its GGUF name, in the file's order, with the
    heads its rows are permuted over into llama.cpp's rope pairs (the query and key projections
    and their biases; None for the rest): what the file holds, and what reads it back
    (:mod:`geospec.prune.gguf_weights`)."""
    config = model.config
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    inner = model.model
    found: list[tuple[str, torch.Tensor, int | None]] = [
        ("token_embd.weight", inner.embed_tokens.weight, None),
        ("output_norm.weight", inner.norm.weight, None),
    ]
    embedding = inner.embed_tokens.weight
    head = model.get_output_embeddings().weight
    if head.data_ptr() != embedding.data_ptr():  # untied: llama.cpp reuses token_embd otherwise
        found.append(("output.weight", head, None))
    for i, layer in enumerate(inner.layers):
        attn, mlp = layer.self_attn, layer.mlp
        found += [
            (f"blk.{i}.attn_norm.weight", layer.input_layernorm.weight, None),
            (f"blk.{i}.attn_q.weight", attn.q_proj.weight, heads),
            (f"blk.{i}.attn_k.weight", attn.k_proj.weight, kv_heads),
            (f"blk.{i}.attn_v.weight", attn.v_proj.weight, None),
            (f"blk.{i}.attn_output.weight", attn.o_proj.weight, None),
            (f"blk.{i}.ffn_norm.weight", layer.post_attention_layernorm.weight, None),
            (f"blk.{i}.ffn_gate.weight", mlp.gate_proj.weight, None),
            (f"blk.{i}.ffn_up.weight", mlp.up_proj.weight, None),
            (f"blk.{i}.ffn_down.weight", mlp.down_proj.weight, None),
        ]
        # the optional biases deci reads (Qwen2's q/k/v, a compensated cut's down projection);
        # the query and key biases follow their rows into llama.cpp's rope pairs
        biases = {
            "attn_q": (attn.q_proj, heads),
            "attn_k": (attn.k_proj, kv_heads),
            "attn_v": (attn.v_proj, None),
            "attn_output": (attn.o_proj, None),
            "ffn_gate": (mlp.gate_proj, None),
            "ffn_up": (mlp.up_proj, None),
            "ffn_down": (mlp.down_proj, None),
        }
        for name, (module, permuted) in biases.items():
            bias = getattr(module, "bias", None)
            if bias is not None:
                found.append((f"blk.{i}.{name}.bias", bias, permuted))
    return found


def _tensors(model: Any) -> tuple[list[tuple[str, np.ndarray]], list[int]]:
    """Every tensor under its GGUF name (float32 numpy, transformers' out x in layout, which GGUF
    stores as ne = (in, out)), and each layer's FFN width read from its tensors."""
    from geospec.measure.cut import ffn_width
    from geospec.prune.true_width import mlps

    def array(tensor: torch.Tensor) -> np.ndarray:
        return tensor.detach().to("cpu", torch.float32).contiguous().numpy()

    out = [
        (name, _permute(array(tensor), heads) if heads else array(tensor))
        for name, tensor, heads in gguf_parameters(model)
    ]
    return out, [ffn_width(mlp) for mlp in mlps(model)]


def _permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """transformers' rotate-half rows (each head's first half, then its second) to llama.cpp's
    interleaved pairs (convert_hf_to_gguf.py's ``LlamaModel.permute``)."""
    rows = weights.shape[0]
    return (
        weights.reshape(heads, 2, rows // heads // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def unpermute(weights: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's interleaved pairs back to transformers' rotate-half rows (the inverse of
    the writer's permutation)."""
    rows = weights.shape[0]
    return (
        weights.reshape(heads, rows // heads // 2, 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def _add_tensor(
    writer: Any, name: str, tensor: np.ndarray, dtype: str, output: bool, gguf: Any
) -> None:
    """Vectors in f32 (as llama.cpp's converter keeps norms); matrices in ``dtype`` (gguf-py's
    types: the floats and the legacy ones), as llama.cpp's quantizer chooses for a legacy type:
    the ``output`` matrix (the embedding, when tied) in Q8_0 (llama.cpp keeps it at Q6_K or Q8_0;
    gguf-py has no Q6_K), and a matrix whose rows do not split into blocks in f16."""
    kind = gguf.GGMLQuantizationType
    if tensor.ndim == 1 or dtype == "f32":
        writer.add_tensor(name, tensor.astype(np.float32))
        return
    if dtype != "f16":
        target = kind.Q8_0 if output else main_type(dtype, gguf)
        if tensor.shape[-1] % gguf.GGML_QUANT_SIZES[target][0] == 0:
            packed = gguf.quants.quantize(tensor, target)
            writer.add_tensor(name, packed, raw_shape=packed.shape, raw_dtype=target)
            return
    writer.add_tensor(name, tensor.astype(np.float16))


def _tokenizer(writer: Any, source: Path, vocab_size: int, gguf: Any) -> None:
    source = Path(source)
    if source.is_file() and source.suffix == ".gguf":
        _copy_tokenizer(writer, source, vocab_size, gguf)
    elif (source / "tokenizer.json").is_file():
        _bpe_tokenizer(writer, source, vocab_size, gguf)
    else:
        raise UsageError(
            f"--tokenizer {source}: neither a .gguf file nor a directory with tokenizer.json"
        )


def _copy_tokenizer(writer: Any, source: Path, vocab_size: int, gguf: Any) -> None:
    """Every ``tokenizer.*`` field of the GGUF file ``source``, as it is there."""
    reader = gguf.GGUFReader(str(source))
    fields = {key: field for key, field in reader.fields.items() if key.startswith("tokenizer.")}
    tokens = fields.get("tokenizer.ggml.tokens")
    if tokens is None:
        raise UsageError(f"--tokenizer {source}: the GGUF file holds no tokenizer")
    if len(tokens.data) != vocab_size:
        raise UsageError(
            f"--tokenizer {source}: its {len(tokens.data)} tokens are not the model's vocabulary "
            f"of {vocab_size}; give the tokenizer the model was pruned or trained with"
        )
    kind = gguf.GGUFValueType
    for key, field in fields.items():
        main = field.types[0]
        if main == kind.ARRAY:
            values = [_scalar(field, field.parts[i], field.types[-1], kind) for i in field.data]
            writer.add_array(key, values)  # element type as llama.cpp's converter infers it
        else:
            writer.add_key_value(key, _scalar(field, field.parts[field.data[0]], main, kind), main)


def _scalar(field: Any, part: np.ndarray, value_type: Any, kind: Any) -> Any:
    if value_type == kind.STRING:
        return bytes(part).decode("utf-8")
    if value_type == kind.BOOL:
        return bool(part[0])
    value = part[0]
    return float(value) if value_type in (kind.FLOAT32, kind.FLOAT64) else int(value)


#: llama.cpp's names of the byte-level BPE pre-tokenizers this writer recognises in a
#: tokenizer.json (src/llama-vocab.cpp): GPT-2's regex alone, and SmolLM's digits split first.
PRE_TOKENIZERS = {("ByteLevel",): "gpt-2", ("Digits", "ByteLevel"): "smollm"}
#: Qwen2's split before its byte-level BPE (transformers' tokenization_qwen2.PRETOKENIZE_REGEX):
#: llama.cpp's ``qwen2`` pre-tokenizer runs this regex (src/llama-vocab.cpp,
#: LLAMA_VOCAB_PRE_TYPE_QWEN2, "original regex from tokenizer.json", rewritten without (?i:)).
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _bpe_tokenizer(writer: Any, directory: Path, vocab_size: int, gguf: Any) -> None:
    """A byte-level BPE tokenizer.json as llama.cpp's ``gpt2`` tokenizer model (tokens in id
    order, special ones as control tokens, merges, special ids and the chat template)."""
    file = directory / "tokenizer.json"
    try:
        spec = json.loads(file.read_text())
    except (OSError, ValueError) as error:
        raise UsageError(f"{file}: unreadable ({error})") from None
    model = spec.get("model") or {}
    pre = _pre_tokenizer(spec.get("pre_tokenizer"))
    if model.get("type") != "BPE" or pre is None:
        raise UsageError(
            f"{file}: not a byte-level BPE tokenizer of a kind the GGUF writer maps (GPT-2's, "
            "SmolLM's, Qwen2's); give --tokenizer a .gguf file holding the model's tokenizer"
        )
    vocab: dict[str, int] = dict(model["vocab"])
    special = {t["content"]: t for t in spec.get("added_tokens", [])}
    for content, token in special.items():
        vocab[content] = int(token["id"])
    if max(vocab.values()) >= vocab_size:
        raise UsageError(
            f"{file}: token id {max(vocab.values())} is beyond the model's vocabulary of "
            f"{vocab_size}; give the tokenizer the model was pruned or trained with"
        )
    by_id = {i: t for t, i in vocab.items()}
    tokens, types = [], []
    for i in range(vocab_size):
        token = by_id.get(i)
        if token is None:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        elif token in special:
            tokens.append(token)
            control = special[token].get("special", True)
            types.append(gguf.TokenType.CONTROL if control else gguf.TokenType.USER_DEFINED)
        else:
            tokens.append(token)
            types.append(gguf.TokenType.NORMAL)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    gguf.SpecialVocab(directory, load_merges=True, n_vocab=vocab_size).add_to_gguf(
        writer, quiet=True
    )


def _pre_tokenizer(pre: Any) -> str | None:
    """llama.cpp's name for the pre-tokenizer, or None when it is not one it would reproduce."""
    if not isinstance(pre, dict):
        return None
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    if [step.get("type") for step in steps] == ["Split", "ByteLevel"]:
        split, byte_level = steps
        qwen2 = (
            (split.get("pattern") or {}).get("Regex") == QWEN2_SPLIT
            and split.get("behavior") == "Isolated"
            and not split.get("invert")
            and not byte_level.get("add_prefix_space")
            and not byte_level.get("use_regex", True)  # the split is the only regex
        )
        return "qwen2" if qwen2 else None
    for step in steps:
        if step.get("type") == "ByteLevel" and (
            step.get("add_prefix_space") or not step.get("use_regex", True)
        ):
            return None  # llama.cpp's gpt2 pre-tokenizers add no prefix space and split by regex
        if step.get("type") == "Digits" and not step.get("individual_digits"):
            return None
    return PRE_TOKENIZERS.get(tuple(str(step.get("type")) for step in steps))


def gguf_widths(path: Path) -> list[int]:
    """The per-layer FFN widths of a deci GGUF file, checked against its tensors: one line naming
    the file when ``deci.feed_forward_length`` disagrees with a layer's ``ffn_gate``."""
    gguf = _import_gguf()
    try:
        reader = gguf.GGUFReader(str(path))
    except (OSError, ValueError) as error:
        raise UsageError(f"{path}: not a readable GGUF file ({error})") from None
    field = reader.fields.get(f"{ARCH}.feed_forward_length")
    if field is None:
        raise UsageError(f"{path}: no {ARCH}.feed_forward_length; not a per-layer-width GGUF file")
    widths = [int(field.parts[i][0]) for i in field.data]
    shapes = {t.name: [int(n) for n in t.shape] for t in reader.tensors}
    for layer, width in enumerate(widths):
        shape = shapes.get(f"blk.{layer}.ffn_gate.weight")
        if shape is None or shape[1] != width:
            raise UsageError(
                f"{path}: {ARCH}.feed_forward_length gives layer {layer} width {width} but its "
                f"ffn_gate tensor has shape {shape}; the per-layer widths disagree with the "
                "tensors: write the file again"
            )
    return widths
