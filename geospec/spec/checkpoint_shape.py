"""A pretrained reference's shape, read from its checkpoint: `[model]` is not copied by hand.

The spec's ``[model]`` may leave out what the checkpoint says (layers, widths, heads, vocabulary,
activation, norm, positions, tied embeddings, FFN bias) and keep only what is the spec's own choice
(``seq_len``, ``multiple_of``); :func:`fill_model` fills it from ``config.json`` (a local directory,
or a hub id at a commit found in the Hugging Face cache) or from a GGUF file's metadata, and a value
the spec gives that contradicts the checkpoint is an error naming both.

Torch- and numpy-free (``geospec validate`` runs it): GGUF metadata is read by
:func:`read_gguf_header`, a few lines of ``struct`` over the file's documented header, rather than
the ``gguf`` package, which needs numpy.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

#: The ``[model]`` fields a checkpoint determines; ``seq_len``, ``multiple_of`` and ``dropout`` are
#: the spec's own.
CHECKPOINT_FIELDS = (
    "n_layers",
    "d_model",
    "n_heads",
    "n_kv_heads",
    "ffn_width",
    "activation",
    "vocab_size",
    "norm",
    "positions",
    "rope_theta",
    "tie_embeddings",
    "bias",
)

#: transformers' default ``tie_word_embeddings`` per family, for a config.json that leaves it out.
_TIED_BY_DEFAULT = {
    "llama": False,
    "mistral": False,
    "qwen2": False,
    "gemma": True,
    "gemma2": True,
    "gemma3_text": True,  # Gemma 3's text models (gemma-3-270m, -1b); a GGUF names it gemma3
}
#: GGUF architectures of the gated families (their metadata keys are prefixed by this name).
GGUF_GATED_ARCHITECTURES = ("llama", "mistral", "qwen2", "gemma", "gemma2", "gemma3")
#: Families with a gated FFN (three matrices: geospec's ``swiglu`` layout, whatever the gate's
#: nonlinearity), rmsnorm and rotary positions.
GATED_FAMILIES = frozenset(_TIED_BY_DEFAULT)


@dataclass(frozen=True)
class CheckpointShape:
    """The ``[model]`` values a checkpoint determines, and where each was read."""

    values: dict[str, Any]
    origin: dict[str, str] = field(default_factory=dict)
    """field -> the checkpoint key it came from (``num_hidden_layers``), for messages."""
    described: str = ""
    """What was read (``config.json of /models/llama``), for messages."""


def shape_from_config(config: Mapping[str, Any], described: str) -> CheckpointShape | None:
    """The shape a transformers ``config.json`` gives, or None for a family geospec cannot read."""
    family = config.get("model_type")
    if family == "gpt2":
        d_model = config["n_embd"]
        inner = config.get("n_inner")
        return CheckpointShape(
            {
                "n_layers": config["n_layer"],
                "d_model": d_model,
                "n_heads": config["n_head"],
                "n_kv_heads": None,
                "ffn_width": inner if inner is not None else 4 * d_model,
                "activation": "gelu",
                "vocab_size": config["vocab_size"],
                "norm": "layernorm",
                "positions": "learned",
                "tie_embeddings": config.get("tie_word_embeddings", True),
                "bias": True,
            },
            {
                "n_layers": "n_layer",
                "d_model": "n_embd",
                "n_heads": "n_head",
                "ffn_width": "n_inner",
            },
            described,
        )
    if family not in GATED_FAMILIES:
        return None
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    parameters = config.get("rope_parameters") or {}
    theta = config.get("rope_theta", parameters.get("rope_theta", 10000.0))
    return CheckpointShape(
        {
            "n_layers": config["num_hidden_layers"],
            "d_model": config["hidden_size"],
            "n_heads": heads,
            "n_kv_heads": kv_heads if kv_heads != heads else None,
            "ffn_width": config["intermediate_size"],
            "activation": "swiglu",
            "vocab_size": config["vocab_size"],
            "norm": "rmsnorm",
            "positions": "rope",
            "rope_theta": float(theta),
            "tie_embeddings": config.get("tie_word_embeddings", _TIED_BY_DEFAULT[family]),
            "bias": bool(config.get("mlp_bias", False)),
        },
        {
            "n_layers": "num_hidden_layers",
            "d_model": "hidden_size",
            "n_heads": "num_attention_heads",
            "n_kv_heads": "num_key_value_heads",
            "ffn_width": "intermediate_size",
            "rope_theta": "rope_theta",
            "tie_embeddings": "tie_word_embeddings",
            "bias": "mlp_bias",
        },
        described,
    )


def shape_from_gguf(path: Path) -> CheckpointShape | None:
    """The shape a GGUF file's metadata gives (Llama-layout architectures), or None."""
    metadata, tensors = read_gguf_header(path)
    arch = metadata.get("general.architecture")
    if arch not in GGUF_GATED_ARCHITECTURES:
        return None
    heads = metadata[f"{arch}.attention.head_count"]
    kv_heads = metadata.get(f"{arch}.attention.head_count_kv", heads)
    vocab = metadata.get(f"{arch}.vocab_size", metadata.get("tokenizer.ggml.tokens"))
    values = {
        "n_layers": metadata[f"{arch}.block_count"],
        "d_model": metadata[f"{arch}.embedding_length"],
        "n_heads": heads,
        "n_kv_heads": kv_heads if kv_heads != heads else None,
        "ffn_width": metadata[f"{arch}.feed_forward_length"],
        "activation": "swiglu",
        "vocab_size": vocab,
        "norm": "rmsnorm",
        "positions": "rope",
        "rope_theta": float(metadata.get(f"{arch}.rope.freq_base", 10000.0)),
        # A GGUF stores a separate output matrix only when the embeddings are not tied.
        "tie_embeddings": "output.weight" not in tensors,
        "bias": "blk.0.ffn_up.bias" in tensors,
    }
    origin = {
        "n_layers": f"{arch}.block_count",
        "d_model": f"{arch}.embedding_length",
        "n_heads": f"{arch}.attention.head_count",
        "n_kv_heads": f"{arch}.attention.head_count_kv",
        "ffn_width": f"{arch}.feed_forward_length",
        "vocab_size": "tokenizer.ggml.tokens",
        "rope_theta": f"{arch}.rope.freq_base",
    }
    return CheckpointShape(values, origin, f"the GGUF metadata of {path}")


class GGUFFormatError(ValueError):
    """The file is not a GGUF file this reader understands."""


_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q"}
_SCALARS |= {11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


def read_gguf_header(path: Path) -> tuple[dict[str, Any], set[str]]:
    """A GGUF file's metadata (key -> value; an array of strings is given as its length, which is
    all the shape needs) and its tensors' names, read from the header (versions 2 and 3) without
    touching the tensor data."""
    metadata, tensors, _ = _read_header(path)
    return metadata, set(tensors)


def gguf_tensor_types(path: Path) -> list[tuple[tuple[int, ...], int]]:
    """Each tensor's dimensions and ggml type id, from a GGUF file's header."""
    _, tensors, _ = _read_header(path)
    return [(info.dims, info.kind) for info in tensors.values()]


@dataclass(frozen=True)
class TensorInfo:
    """Where a GGUF tensor's data lies: its dimensions, GGML type and offset in the data."""

    dims: tuple[int, ...]
    kind: int
    offset: int


def _read_header(path: Path) -> tuple[dict[str, Any], dict[str, TensorInfo], int]:
    """The metadata, the tensors' infos by name, and where the tensor data starts."""
    with path.open("rb") as file:
        if file.read(4) != b"GGUF":
            raise GGUFFormatError("not a GGUF file: it does not start with the GGUF magic")
        (version,) = _unpack(file, "<I")
        if version not in (2, 3):
            raise GGUFFormatError(f"GGUF version {version} (this reader knows 2 and 3)")
        n_tensors, n_values = _unpack(file, "<QQ")
        metadata = {}
        for _ in range(n_values):
            key = _string(file)
            (kind,) = _unpack(file, "<I")
            metadata[key] = _value(file, kind)
        tensors = {}
        for _ in range(n_tensors):
            name = _string(file)
            (n_dims,) = _unpack(file, "<I")
            dims = _unpack(file, f"<{n_dims}Q")
            kind, offset = _unpack(file, "<IQ")
            tensors[name] = TensorInfo(tuple(dims), kind, offset)
        alignment = metadata.get("general.alignment", 32)
        start = -(-file.tell() // alignment) * alignment  # the data is aligned
    return metadata, tensors, start


#: Values and bytes per block of the GGML tensor types, by type id (ggml's type traits, as
#: gguf-py's GGML_QUANT_SIZES lists them): F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, the
#: K-quants Q2_K..Q8_K and BF16; what a tensor's data takes in the file.
GGML_BLOCKS = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24),
               8: (32, 34), 9: (32, 40), 10: (256, 84), 11: (256, 110), 12: (256, 144),
               13: (256, 176), 14: (256, 210), 15: (256, 292), 30: (1, 2)}  # fmt: skip


def gguf_data_problem(path: Path) -> str | None:
    """Why the GGUF file ``path`` cannot hold its own tensors (None: its size is what they need):
    a download, or an assembly of parts, cut short or padded. The header is read; the data's
    extent follows from each tensor's offset and size (a tensor of a type not in
    :data:`GGML_BLOCKS` counts from its offset only)."""
    try:
        _, tensors, start = _read_header(path)
    except GGUFFormatError as error:
        return f"it is not a readable GGUF file ({error}); fetch or assemble it again"
    if not tensors:
        return None  # a header alone (metadata only) has no data to miss
    size = path.stat().st_size
    end, exact = start, True
    for info in tensors.values():
        values = 1
        for n in info.dims:
            values *= n
        block = GGML_BLOCKS.get(info.kind)
        exact = exact and block is not None
        length = values // block[0] * block[1] if block is not None else 1
        end = max(end, start + info.offset + length)
    if size < end or (exact and size > end + 64):  # the writer pads the last tensor a little
        return (
            f"its {len(tensors)} tensors end at byte {end:,} but the file has {size:,} bytes: "
            "it is incomplete or has extra data (a download or an assembly of parts cut short "
            "or doubled); fetch or assemble it again"
        )
    return None


def _unpack(file: BinaryIO, layout: str) -> tuple[Any, ...]:
    size = struct.calcsize(layout)
    data = file.read(size)
    if len(data) != size:
        raise GGUFFormatError("the GGUF header ends early")
    return struct.unpack(layout, data)


def _string(file: BinaryIO) -> str:
    (length,) = _unpack(file, "<Q")
    return file.read(length).decode("utf-8", errors="replace")


def _value(file: BinaryIO, kind: int) -> Any:
    if kind in _SCALARS:
        return _unpack(file, _SCALARS[kind])[0]
    if kind == _STRING:
        return _string(file)
    if kind == _ARRAY:
        element, count = _unpack(file, "<IQ")
        if element == _STRING:
            for _ in range(count):
                (length,) = _unpack(file, "<Q")
                file.seek(length, 1)
            return count
        if element in _SCALARS:
            size = struct.calcsize(_SCALARS[element])
            return list(struct.unpack(f"<{count}{_SCALARS[element][1]}", file.read(size * count)))
        return [_value(file, element) for _ in range(count)]
    raise GGUFFormatError(f"unknown GGUF value type {kind}")


def read_checkpoint_shape(
    checkpoint: str, revision: str | None, spec_dir: Path
) -> CheckpointShape | str:
    """The shape of ``reference.checkpoint``, or why it cannot be read (a sentence)."""
    if revision is not None:
        from geospec.hub import HUB_ID
        from geospec.spec.sections import COMMIT

        if not (HUB_ID.match(checkpoint) and COMMIT.match(revision)):
            return "it is no hub id at a commit (the spec's own check says why)"
        return _hub_shape(checkpoint, revision)
    from geospec.hub import spec_path

    path = spec_path(checkpoint, spec_dir)
    if path.is_file() and path.suffix == ".gguf":
        try:
            shape = shape_from_gguf(path)
        except (GGUFFormatError, OSError) as error:
            # a damaged file (cut inside its header, parts out of order): no [model] helps
            return GGUFUnreadable(
                f"reference.checkpoint: {path} is not a readable GGUF file ({error}); fetch or "
                "assemble it again"
            )
        except KeyError as error:
            return f"its GGUF metadata cannot be read ({error})"
        return shape or "its GGUF architecture is not one whose shape geospec reads"
    if (path / "config.json").is_file():
        return _config_shape(path / "config.json", f"config.json of {path}")
    return f"{path} has no config.json"


class HubUnreadable(str):
    """Why a hub checkpoint's config.json cannot be had (a complete line naming the field)."""


class GGUFUnreadable(str):
    """A local GGUF file whose header cannot be read (a complete line naming the field)."""


def _hub_shape(checkpoint: str, revision: str) -> CheckpointShape | str:
    """config.json of a hub id at its commit: from the Hugging Face cache, or downloaded (one
    small file; offline, a commit missing from the cache is said with the commits it holds)."""
    from geospec.errors import UsageError
    from geospec.hub import Source, check_hub_files

    try:
        cached = check_hub_files(
            Source(checkpoint, "reference.checkpoint", revision=revision), "config.json"
        )
    except UsageError as error:
        return HubUnreadable(str(error))
    return _config_shape(Path(cached), f"config.json of {checkpoint} at {revision[:12]}")


def _config_shape(path: Path, described: str) -> CheckpointShape | str:
    try:
        config = json.loads(path.read_text())
        shape = shape_from_config(config, described)
    except (OSError, ValueError, KeyError) as error:
        return f"{described} cannot be read ({error!r})"
    if shape is None:
        family = config.get("model_type")
        return f"{described}: model_type {family!r} is not one whose shape geospec reads"
    return shape


def fill_model(
    model: dict[str, Any], shape: CheckpointShape, problem: Callable[[str, str], None]
) -> None:
    """Fill ``model`` (the spec's ``[model]`` table as read) from ``shape``; each given value
    that contradicts the checkpoint is reported through ``problem(field, message)``."""
    for name in CHECKPOINT_FIELDS:
        if name not in shape.values:
            continue
        truth = shape.values[name]
        if name not in model:
            if truth is not None:
                model[name] = truth
            continue
        given = model[name]
        if name == "n_kv_heads" and truth is None:
            truth = shape.values["n_heads"]  # one key/value head per query head, said explicitly
        same = float(given) == float(truth) if name == "rope_theta" else given == truth
        if not same:
            key = shape.origin.get(name)
            says = f"{truth!r} ({key})" if key else repr(truth)
            problem(
                name,
                f"{given!r} contradicts the checkpoint: {shape.described} says {says}; "
                "remove the value (it is read from the checkpoint) or fix it",
            )


@dataclass(frozen=True)
class CheckpointFacts:
    """What a checkpoint's config.json or GGUF metadata says beyond ``[model]``'s shape, for the
    checks ``geospec validate`` makes against it (:mod:`geospec.spec.file_checks`)."""

    described: str
    """What was read (``config.json of /models/llama``), for messages."""
    family: str | None
    """config.json's ``model_type``, or the GGUF file's ``general.architecture``."""
    architectures: tuple[str, ...] = ()
    """config.json's ``architectures`` (``Phi3ForCausalLM``)."""
    positions: int | None = None
    """The most positions the model was built for (None: the checkpoint does not say)."""
    positions_key: str = ""
    """The key ``positions`` was read from (``max_position_embeddings``)."""
    vocab_size: int | None = None
    experts: int = 0
    """Experts per FFN (a mixture of experts; 0 for a dense FFN)."""
    dtype: str | None = None
    """The dtype config.json declares its weights in (``dtype``, or 4.x's ``torch_dtype``);
    None for a GGUF file or a config that does not say."""


#: config.json keys holding a model's maximum positions, in the order transformers' families use.
_POSITION_KEYS = ("max_position_embeddings", "n_positions", "n_ctx", "seq_length")
_EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")


def facts_from_config(config: Mapping[str, Any], described: str) -> CheckpointFacts:
    """The facts a transformers ``config.json`` gives."""
    key = next((k for k in _POSITION_KEYS if isinstance(config.get(k), int)), "")
    experts = next((config[k] for k in _EXPERT_KEYS if isinstance(config.get(k), int)), 0)
    vocab = config.get("vocab_size")
    dtype = config.get("dtype", config.get("torch_dtype"))
    return CheckpointFacts(
        described,
        config.get("model_type") if isinstance(config.get("model_type"), str) else None,
        tuple(a for a in config.get("architectures") or () if isinstance(a, str)),
        config[key] if key else None,
        key,
        vocab if isinstance(vocab, int) else None,
        experts,
        dtype if isinstance(dtype, str) else None,
    )


def facts_from_gguf(path: Path) -> CheckpointFacts:
    """The facts a GGUF file's metadata gives."""
    metadata, _ = read_gguf_header(path)
    arch = metadata.get("general.architecture")
    arch = arch if isinstance(arch, str) else None
    key = f"{arch}.context_length"
    positions = metadata.get(key)
    vocab = metadata.get(f"{arch}.vocab_size", metadata.get("tokenizer.ggml.tokens"))
    experts = metadata.get(f"{arch}.expert_count", 0)
    return CheckpointFacts(
        f"the GGUF metadata of {path}",
        arch,
        (),
        positions if isinstance(positions, int) else None,
        key,
        vocab if isinstance(vocab, int) else None,
        experts if isinstance(experts, int) else 0,
    )


def read_checkpoint_facts(
    checkpoint: str, revision: str | None, spec_dir: Path
) -> CheckpointFacts | None:
    """The facts of ``reference.checkpoint``, or None where they cannot be read (a missing or
    unreadable checkpoint is said by :func:`read_checkpoint_shape`'s caller already)."""
    if revision is not None:
        from geospec.errors import UsageError
        from geospec.hub import HUB_ID, Source, check_hub_files
        from geospec.spec.sections import COMMIT

        if not (HUB_ID.match(checkpoint) and COMMIT.match(revision)):
            return None
        try:
            cached = check_hub_files(
                Source(checkpoint, "reference.checkpoint", revision=revision), "config.json"
            )
        except UsageError:
            return None
        path, described = Path(cached), f"config.json of {checkpoint} at {revision[:12]}"
    else:
        from geospec.hub import spec_path

        local = spec_path(checkpoint, spec_dir)
        if local.is_file() and local.suffix == ".gguf":
            try:
                return facts_from_gguf(local)
            except (GGUFFormatError, OSError):
                return None
        path, described = local / "config.json", f"config.json of {local}"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return facts_from_config(config, described) if isinstance(config, dict) else None
