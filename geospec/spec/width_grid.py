"""The width grid of a prune: the multiple every pruned FFN width is rounded to
(``model.multiple_of``), chosen to suit the file the pruned model is shipped as.

A GGUF file stores each matrix row in blocks: 32 values for llama.cpp's legacy types (Q4_0, Q4_1,
Q5_0, Q5_1, Q8_0), 256 for its K-quants (Q2_K ... Q6_K and their mixes). A pruned layer's
``ffn_down`` has the layer's width as its rows, so a width off the block grid cannot be stored in
the file's type: llama.cpp's quantizer falls back (Q4_K to Q5_0, Q6_K to Q8_0: larger and no
faster; Qwen2.5-Coder-1.5B at 3/4, widths 6,592 and 6,528, had 26 down projections fall back
and ran no faster than its source). A prune of a local GGUF file is exported in that file's own
type (:mod:`geospec.prune.gguf_quant`), so where the spec leaves ``model.multiple_of`` out the
grid is that type's block (:func:`fill_grid`, before the spec is validated); a spec that sets
it keeps its own, and ``geospec validate`` says which grid is in force and why
(:func:`grid_line`).

Torch- and numpy-free (``geospec validate`` runs it): the file's type is read from its header
(:func:`geospec.spec.checkpoint_shape.read_gguf_header`), not with gguf-py.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from geospec.spec.sections import Spec

#: llama.cpp's legacy types, of blocks of 32 (gguf-py's numpy quantizer writes them too).
LEGACY = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1")
#: llama.cpp's K-quant file types, of blocks of 256 (written by its quantizer only).
K_QUANTS = (
    "q2_k", "q2_k_s", "q3_k_s", "q3_k_m", "q3_k_l", "q4_k_s", "q4_k_m", "q5_k_s", "q5_k_m", "q6_k",
)  # fmt: skip
#: llama.cpp's fallback for a K-quant's main type whose blocks of 256 do not fit a row
#: (src/llama-quant.cpp, ``tensor_type_fallback``), by the type's first two letters.
K_FALLBACK = {"q2": "q4_0", "q3": "q4_0", "q4": "q5_0", "q5": "q5_1", "q6": "q8_0"}
LEGACY_BLOCK, K_BLOCK = 32, 256

#: ``general.file_type`` (llama.cpp's ``llama_ftype``) of the types above, and of the floats.
FILE_TYPES = {0: "f32", 1: "f16", 2: "q4_0", 3: "q4_1", 7: "q8_0", 8: "q5_0", 9: "q5_1",
              10: "q2_k", 11: "q3_k_s", 12: "q3_k_m", 13: "q3_k_l", 14: "q4_k_s", 15: "q4_k_m",
              16: "q5_k_s", 17: "q5_k_m", 18: "q6_k", 21: "q2_k_s", 32: "bf16"}  # fmt: skip
#: ggml's tensor type ids, for a file that declares no ``general.file_type`` (the type most of
#: its matrices are stored in stands for the file's, a K-quant's as its medium mix).
TENSOR_TYPES = {0: "f32", 1: "f16", 2: "q4_0", 3: "q4_1", 6: "q5_0", 7: "q5_1", 8: "q8_0",
                10: "q2_k", 11: "q3_k_m", 12: "q4_k_m", 13: "q5_k_m", 14: "q6_k",
                30: "bf16"}  # fmt: skip


def block_of(dtype: str) -> int | None:
    """The values per block a GGUF type stores a row in (None: a float type, no blocks)."""
    if dtype in K_QUANTS:
        return K_BLOCK
    if dtype in LEGACY:
        return LEGACY_BLOCK
    return None


def gguf_file_type(path: Path) -> str | None:
    """A GGUF file's weight type as a ``--dtype`` names it (q4_1, q4_k_m, f16), from its
    ``general.file_type`` or, where it declares none, the type most of its matrices are in; None
    for a type the writer does not write (an i-quant)."""
    from geospec.spec.checkpoint_shape import gguf_tensor_types, read_gguf_header

    metadata, _ = read_gguf_header(path)
    declared = metadata.get("general.file_type")
    if isinstance(declared, int):
        return FILE_TYPES.get(declared)
    matrices = Counter(kind for dims, kind in gguf_tensor_types(path) if len(dims) == 2)
    if not matrices:
        return None
    return TENSOR_TYPES.get(matrices.most_common(1)[0][0])


@dataclass(frozen=True)
class ExportGrid:
    """The grid a prune's GGUF export suits: its type and that type's block (None: no grid the
    file asks for), and why, in words."""

    dtype: str | None
    block: int | None
    reason: str


def export_grid(path: Path, ffn_width: int) -> ExportGrid:
    """The grid the export of a prune of the GGUF file ``path`` suits: the block of the file's
    own type (the export's default) where it divides the unpruned ``ffn_width``."""
    dtype = gguf_file_type(path)
    if dtype is None:
        return ExportGrid(None, None, "the source's type is not one the GGUF writer writes: f16")
    label = dtype.upper() if dtype not in ("f32", "f16", "bf16") else dtype
    block = block_of(dtype)
    if block is None:
        return ExportGrid(dtype, None, f"the export's {label} has no blocks to follow")
    if ffn_width % block:
        return ExportGrid(
            dtype,
            None,
            f"the export's {label} stores rows in blocks of {block}, which do not divide the FFN "
            f"width {ffn_width}",
        )
    return ExportGrid(dtype, block, f"the blocks of the export's {label}, the source file's type")


def _local_gguf(reference: Any, spec_dir: Path) -> Path | None:
    """The reference's local GGUF file (``reference.checkpoint`` without a revision)."""
    from geospec.hub import spec_path

    if not isinstance(reference, dict):
        return None
    checkpoint = reference.get("checkpoint")
    if not isinstance(checkpoint, str) or reference.get("revision") is not None:
        return None
    path = spec_path(checkpoint, spec_dir)
    return path if path.suffix == ".gguf" and path.is_file() else None


def fill_grid(data: dict[str, Any], spec_dir: Path) -> None:
    """Set ``model.multiple_of`` in ``data`` (the spec's TOML as read, ``[model]`` filled from
    the checkpoint) to the block of the GGUF export's type where the spec prunes a local GGUF
    file and leaves it out (:func:`export_grid`)."""
    model = data.get("model")
    if "prune" not in data or not isinstance(model, dict) or "multiple_of" in model:
        return
    source = _local_gguf(data.get("reference"), spec_dir)
    width = model.get("ffn_width")
    if source is None or not isinstance(width, int) or width <= 0:
        return
    try:
        grid = export_grid(source, width)
    except (OSError, ValueError):  # an unreadable header is said by the shape's own check
        return
    if grid.block is not None:
        model["multiple_of"] = grid.block


def _shares(spec: Spec, multiple: int) -> str:
    """What each keep fraction keeps on the grid where its rounding moves it (Qwen2.5-Coder-
    1.5B's 8,960 neurons at keep 0.5 on a grid of 256: 4,608 a layer, 0.514): every arm's
    budget is that uniform width's, so the pruned model is that much larger or smaller."""
    from geospec.shapes.pruned import keep_problem, pruned_width

    width = spec.model.ffn_width
    assert spec.prune is not None
    moved = []
    for keep in spec.prune.fractions:
        if keep_problem(keep, width, multiple) is not None:
            continue  # refused in its own line
        kept = min(pruned_width(keep, width, multiple), width)  # capped, as pruned_dims is
        if abs(kept / width - keep) > 0.0005:
            moved.append(f"keep {keep:g} keeps {kept:,} of {width:,} a layer ({kept / width:.3f})")
    return f"; on this grid {', '.join(moved)}" if moved else ""


def grid_line(spec: Spec, spec_dir: Path) -> str | None:
    """What ``geospec validate`` says of a prune's width grid: the multiple in force and why
    (the export's blocks followed, or the spec's own value against them), and the share each
    keep fraction keeps on it where the grid moves it; None without ``[prune]``."""
    if spec.prune is None:
        return None
    return _grid_words(spec, spec_dir) + _shares(spec, spec.model.multiple_of)


def _grid_words(spec: Spec, spec_dir: Path) -> str:
    """:func:`grid_line`'s multiple and why."""
    assert spec.prune is not None
    multiple = spec.model.multiple_of
    said = f"width grid: FFN widths in multiples of {multiple}"
    reference = spec.reference.model_dump(mode="json")
    source = _local_gguf(reference, spec_dir)
    if source is None:
        return (
            f"{said} (model.multiple_of): the reference is no local GGUF file, so its GGUF "
            "export is f16, with no blocks to follow"
        )
    grid = export_grid(source, spec.model.ffn_width)
    if grid.block is None:
        return f"{said} (model.multiple_of): {grid.reason}"
    label = str(grid.dtype).upper()
    if multiple == grid.block:
        return (
            f"{said}: {grid.reason} (rows of whole blocks are stored in it; "
            "model.multiple_of chooses another)"
        )
    if multiple % grid.block == 0:
        return f"{said} (model.multiple_of): whole blocks of the export's {label} ({grid.block})"
    # llama.cpp's fallback for a K-quant is of blocks of 32; rows off those go to F16
    fallback = "F16"
    if grid.block == K_BLOCK and multiple % LEGACY_BLOCK == 0:
        fallback = K_FALLBACK[str(grid.dtype)[:2]].upper()
    return (
        f"{said} (model.multiple_of), not whole blocks of the export's {label} ({grid.block}): a "
        f"down projection whose width is off that grid is stored as {fallback} instead (larger, "
        "no faster); leave model.multiple_of out to follow the file"
    )
