"""The weight types a GGUF export is written in: which ones there are, which one a source GGUF
file holds (an export's default: a model pruned from a Q4_1 file is written in Q4_1), and who
quantizes them.

llama.cpp's own quantizer (``llama_model_quantize``, which llama-cpp-python exposes) writes every
type, with llama.cpp's own choices per tensor: a tied embedding or output matrix at 6 bits or more,
the K-quant mixes' wider ``attn_v``/``ffn_down`` (src/llama-quant.cpp,
``llama_tensor_get_type_impl``). Without llama-cpp-python, gguf-py's numpy quantizer writes the
legacy types of blocks of 32 (``gguf.quants.quantize``: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1); it has no
K-quant quantizer.

A matrix whose rows (GGUF's ``ne[0]``, a transformers weight's input width) do not split into its
type's blocks is stored as llama.cpp's quantizer stores it (``tensor_type_fallback``): a K-quant
falls back to a type of blocks of 32 (Q4_K to Q5_0, Q5_K to Q5_1, Q6_K to Q8_0, Q2_K and Q3_K to
Q4_0), and a matrix whose rows do not split into 32 either is stored in F16. A pruned FFN's
``ffn_down`` has the layer's width as its rows, so widths that are multiples of 64 but not of 256
fall back under a K-quant. gguf-py's path does the same for its types (F16 where 32 does not
divide). ``gguf`` and ``llama_cpp`` are imported only inside the functions.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from geospec.errors import UsageError

# the types, their blocks and llama.cpp's K-quant fallbacks are the width grid's too
from geospec.spec.width_grid import K_FALLBACK as K_FALLBACK
from geospec.spec.width_grid import K_QUANTS as K_QUANTS
from geospec.spec.width_grid import LEGACY as LEGACY

FLOATS = ("f32", "f16")
DTYPES = FLOATS + LEGACY + K_QUANTS
LLAMA_CPP = "llama.cpp's quantizer"
GGUF_PY = "gguf-py"
#: The llama-cpp-python install line the messages give.
INSTALL = "pip install llama-cpp-python"


def check_dtype(dtype: str, option: str = "--dtype") -> str:
    """``dtype`` in lower case, or one line naming the option and the types there are."""
    name = dtype.lower()
    if name not in DTYPES:
        raise UsageError(f"{option} {dtype!r}: the GGUF writer writes {', '.join(DTYPES)}")
    return name


def file_type(dtype: str, gguf: Any) -> int:
    """``general.file_type`` (llama.cpp's ``llama_ftype``) of a file of ``dtype``."""
    kind = gguf.LlamaFileType
    return int(kind.ALL_F32 if dtype == "f32" else kind[f"MOSTLY_{dtype.upper()}"])


def main_type(dtype: str, gguf: Any) -> Any:
    """The ggml type a file of ``dtype`` stores its matrices in, mixes aside (q4_k_m: Q4_K)."""
    name = dtype.upper().removesuffix("_S").removesuffix("_M").removesuffix("_L")
    return gguf.GGMLQuantizationType[name]


def quantizer(dtype: str, option: str = "--dtype") -> str:
    """Who writes ``dtype``: llama.cpp's quantizer where llama-cpp-python is installed (every
    quantized type), gguf-py otherwise (the floats and the legacy types); a K-quant without
    llama-cpp-python is one line naming the option and the fix."""
    if dtype in FLOATS:
        return GGUF_PY
    if _llama_cpp() is not None:
        return LLAMA_CPP
    if dtype in K_QUANTS:
        raise UsageError(
            f"{option} {dtype}: K-quants are written by llama.cpp's quantizer and "
            f"llama-cpp-python is not installed: {INSTALL}, or choose q4_1 or q8_0 (gguf-py "
            "writes those)"
        )
    return GGUF_PY


def _llama_cpp() -> Any:
    """llama-cpp-python's bindings, or None where it is not installed."""
    try:
        import llama_cpp
    except ImportError:
        return None
    return llama_cpp


@dataclass(frozen=True)
class SourceType:
    """A source GGUF file's weight type, as an export's default."""

    label: str
    """The file's own type as llama.cpp names it (Q4_1, Q4_K_M, BF16)."""
    dtype: str | None
    """The same type as a ``--dtype`` (q4_1, q4_k_m), or None when the writer has none like it."""


def source_type(path: Path) -> SourceType:
    """A GGUF file's weight type: its ``general.file_type``, or, where it declares none, the type
    most of its matrices are stored in."""
    stat = path.stat()
    return _source_type(path.resolve(), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=4)
def _source_type(path: Path, modified: int, size: int) -> SourceType:
    """:func:`source_type`, read once per file version (gguf-py parses a file's whole
    vocabulary on opening it: seconds for a large one, and an export asks twice)."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    field = reader.fields.get("general.file_type")
    if field is not None:
        try:
            label = gguf.LlamaFileType(int(field.parts[field.data[0]][0])).name
        except ValueError:
            label = f"file type {int(field.parts[field.data[0]][0])}"
        label = label.removeprefix("MOSTLY_").removeprefix("ALL_")
        name = label.lower()
        return SourceType(label, name if name in DTYPES else None)
    counts = Counter(t.tensor_type.name for t in reader.tensors if len(t.shape) == 2)
    label = counts.most_common(1)[0][0] if counts else "F32"
    by_type = {"Q4_K": "q4_k_m", "Q5_K": "q5_k_m", "Q3_K": "q3_k_m", "Q2_K": "q2_k"}
    name = by_type.get(label, label.lower())
    return SourceType(label, name if name in DTYPES else None)


def default_dtype(source: Path | None) -> tuple[str, str]:
    """The type an export is written in when none is asked for, and why, in words for the export
    line: a GGUF source's own type (a K-quant one where llama-cpp-python is installed, else the
    type llama.cpp itself falls back to from it), f16 for any other source."""
    if source is None or not (source.is_file() and source.suffix == ".gguf"):
        return "f16", "f16, the default for a source that is not a GGUF file"
    found = source_type(source)
    if found.dtype is None:
        return "f16", f"f16: the source's {found.label} is not a type the writer writes"
    if found.dtype in K_QUANTS and _llama_cpp() is None:
        fallback = K_FALLBACK[found.dtype[:2]]
        return fallback, (
            f"{fallback.upper()}: the source's {found.label} needs llama.cpp's quantizer "
            f"({INSTALL}); {fallback.upper()} is llama.cpp's own fallback for it"
        )
    return found.dtype, f"{found.label}, the source's type"


def quantize_file(unquantized: Path, target: Path, dtype: str, threads: int) -> None:
    """Quantize the GGUF file ``unquantized`` into ``target`` with llama.cpp's quantizer (its
    default parameters: llama.cpp's own per-tensor choices and fallbacks, no importance matrix),
    its log kept quiet; a failure is one line."""
    import ctypes

    llama_cpp = _llama_cpp()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = file_type(dtype, _gguf())
    params.nthread = threads
    # llama-cpp-python prints llama.cpp's log through this logger (its map of ggml's levels is
    # off by one: warnings arrive as errors), a line per tensor: above every level, for quiet
    logger = logging.getLogger("llama-cpp-python")
    level = logger.level
    logger.setLevel(logging.CRITICAL + 1)
    try:
        code = llama_cpp.llama_model_quantize(
            os.fsencode(unquantized), os.fsencode(target), ctypes.byref(params)
        )
    finally:
        logger.setLevel(level)
    if code != 0:
        raise UsageError(
            f"{target}: llama.cpp's quantizer failed to write {dtype} (status {code}); choose "
            "another --dtype (f16 is written without it)"
        )


def _gguf() -> Any:
    import gguf

    return gguf


@contextlib.contextmanager
def scratch_beside(path: Path) -> Iterator[Path]:
    """A temporary file beside ``path`` (on its disk, so a rename or a large file does not cross
    file systems), removed afterwards whatever happens."""
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".unquantized", dir=path.parent)
    os.close(fd)
    scratch = Path(name)
    try:
        yield scratch
    finally:
        scratch.unlink(missing_ok=True)


def block_size(dtype: str) -> int:
    """The elements per block of ``dtype``'s main type (1 for f32 and f16)."""
    if dtype in FLOATS:
        return 1
    gguf = _gguf()
    return int(gguf.GGML_QUANT_SIZES[main_type(dtype, gguf)][0])


#: The FFN matrices of a GGUF file, by their tensor names' ending (``blk.N.ffn_down.weight``).
FFN_MATRICES = ("ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")


@dataclass(frozen=True)
class StoredTypes:
    """What a GGUF file's matrices are stored as, by ggml type name (Q4_1, Q5_0, F16)."""

    matrices: Counter[str]
    """Every matrix."""
    fallbacks: Counter[str]
    """The matrices whose rows do not split into the file type's blocks, by the type each was
    stored in instead."""
    ffn: Counter[str]
    """The FFN matrices (gate, up and down projections)."""
    ffn_fallbacks: Counter[str]
    """The FFN matrices among :attr:`fallbacks`."""


def stored_types(path: Path, dtype: str) -> StoredTypes:
    """What each matrix of the GGUF file ``path`` (of type ``dtype``) is stored as, and which
    fell back for rows that do not split into ``dtype``'s blocks (none for f32 and f16)."""
    block = block_size(dtype)
    found = StoredTypes(Counter(), Counter(), Counter(), Counter())
    for tensor in _gguf().GGUFReader(str(path)).tensors:
        if len(tensor.shape) != 2:
            continue
        kind = tensor.tensor_type.name
        ffn = tensor.name.endswith(FFN_MATRICES)
        fell = block > 1 and int(tensor.shape[0]) % block != 0
        found.matrices[kind] += 1
        if ffn:
            found.ffn[kind] += 1
        if fell:
            found.fallbacks[kind] += 1
        if fell and ffn:
            found.ffn_fallbacks[kind] += 1
    return found


def fallbacks(path: Path, dtype: str) -> Counter[str]:
    """How many of the GGUF file's matrices have rows that do not split into ``dtype``'s blocks,
    by the type each was stored in instead (empty for f32 and f16)."""
    return stored_types(path, dtype).fallbacks


def source_stored_types(source: Path | None, dtype: str) -> StoredTypes | None:
    """What the source GGUF file ``source`` stores its matrices as, where an export of type
    ``dtype`` is in the source's own type (None otherwise: no file, not a GGUF file, another
    type). A model whose rows are not whole blocks falls back in its source as well (Qwen2.5's
    d_model of 896 is 3.5 blocks of 256), so what an export's widths add is the difference."""
    if source is None or source.suffix != ".gguf" or not source.is_file():
        return None
    if source_type(source).dtype != dtype:
        return None
    return stored_types(source, dtype)


def fallback_words(fell: Counter[str], source: Counter[str] | None) -> str:
    """How many matrices fell back, beside how many the source file stores so (where it is of
    the same type): the widths' own share."""
    if source is None:
        return ""
    total, before = sum(fell.values()), sum(source.values())
    if total <= before:
        return f" (the source file stores {before} so: the widths add none)"
    return f" (the source file stores {before} so: the widths add {total - before})"
