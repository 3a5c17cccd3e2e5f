"""A pruned transformers model stored at its true per-layer FFN widths, and loaded back as a plain
transformers model (:func:`load_pruned`).

transformers builds every layer's MLP at the config's one width (``intermediate_size``, GPT-2's
``n_inner``). A true-width checkpoint stores each layer's projections at that layer's own width
(``model.safetensors`` holds the true shapes, nothing padded), the widest layer's width as the
config's width, and the per-layer widths in ``config.json``'s ``geospec`` block (``ffn_widths``,
``padded_to: null``). :func:`load_pruned` builds the model from its config, replaces each layer's
projections by modules of the true shapes (``nn.Linear``; GPT-2's ``Conv1D``) and loads the
tensors strictly: the result is the config's own class (``LlamaForCausalLM``,
``GPT2LMHeadModel``, ...), no remote code, so ``generate``, PEFT and lm-evaluation-harness (given
the model object) use it as they use any transformers model. ``AutoModelForCausalLM
.from_pretrained`` cannot read such a directory (it builds every MLP at the one width); a
padded export (:func:`geospec.prune.hf_export.export_pruned` with ``padded=True``) is for tools
that need that, and :func:`load_pruned` reads it too, dropping the zero padding. A repair's bias
on an FFN output projection is stored with the weights; where the family's MLP has no bias
option (Qwen2, Mistral, Gemma) :func:`load_pruned` gives that projection a bias to hold it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from geospec.errors import UsageError
from geospec.measure.cut import CutError, cut_ffn, ffn_layout, ffn_width
from geospec.measure.probe import decoder_layers

#: The block of config.json where geospec records the widths (as ``geospec export`` does).
RECORD = "geospec"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"


@dataclass(frozen=True)
class Stored:
    """What an export wrote: the widths, and what padding costs (or would cost)."""

    directory: Path
    widths: list[int]
    padded_to: int | None
    """The common FFN width of a padded checkpoint; None: stored at the true widths."""
    parameters: int
    """Parameters stored in the file (tied embeddings once)."""
    true_parameters: int
    """Parameters of the model at its true widths."""
    padded_parameters: int
    """Parameters of the same model padded to its widest layer."""

    @property
    def note(self) -> str:
        """One line: what was stored, and what padding costs in parameters."""
        extra = self.padded_parameters - self.true_parameters
        share = extra / self.true_parameters if self.true_parameters else 0.0
        cost = (
            f"padding to {max(self.widths)} costs {extra:,} parameters (+{share:.1%}), "
            f"{self.padded_parameters:,} against {self.true_parameters:,}"
        )
        if self.padded_to is None:
            return f"stored at the true FFN widths: {self.parameters:,} parameters ({cost})"
        return f"stored padded: {cost}; the padded units compute exactly zero"


def mlps(model: nn.Module) -> list[nn.Module]:
    """Every decoder layer's MLP (its ``mlp`` child, as in every transformers decoder geospec
    cuts), each of a layout geospec can cut."""
    modules = []
    for index, layer in enumerate(decoder_layers(model)):
        mlp = getattr(layer, "mlp", None)
        if not isinstance(mlp, nn.Module):
            raise UsageError(
                f"{type(model).__name__}: decoder layer {index} has no mlp module; true-width "
                "checkpoints hold Llama-family (gate_proj/up_proj/down_proj) and GPT-2 MLPs"
            )
        try:
            ffn_layout(mlp)
        except CutError as error:
            raise UsageError(f"{type(model).__name__}: {error}") from None
        modules.append(mlp)
    return modules


def width_key(config: Any) -> str:
    """The config attribute holding the one FFN width transformers builds."""
    for key in ("intermediate_size", "n_inner"):
        if hasattr(config, key):
            return key
    raise UsageError(f"{type(config).__name__} has no intermediate_size or n_inner")


def parameter_counts(model: nn.Module, widths: Sequence[int]) -> tuple[int, int]:
    """The parameters of ``model`` (its FFNs at ``widths``), and of the same model with every FFN
    padded to the widest: per hidden unit, each input projection's row (and bias) and the output
    projection's column."""
    true = sum(p.numel() for p in model.parameters())  # shared (tied) tensors once
    padded = true
    for mlp, width in zip(mlps(model), widths, strict=True):
        layout = ffn_layout(mlp)
        per_unit = 0
        for name in layout.inputs:
            module = getattr(mlp, name)
            weight = module.weight
            per_unit += weight.shape[0] if layout.transposed else weight.shape[1]
            per_unit += 1 if getattr(module, "bias", None) is not None else 0
        output = getattr(mlp, layout.output).weight
        per_unit += output.shape[1] if layout.transposed else output.shape[0]
        padded += (max(widths) - width) * per_unit
    return true, padded


def read_widths(directory: Path) -> list[int]:
    """The per-layer FFN widths geospec recorded in ``directory``'s config.json, or one line
    naming the file and the fix."""
    config_file = directory / CONFIG_FILE
    if not directory.is_dir():
        raise UsageError(f"{directory}: no such directory; give a directory geospec exported")
    try:
        config = json.loads(config_file.read_text())
    except FileNotFoundError:
        raise UsageError(
            f"{config_file}: not found; give a directory written by geospec prune or geospec export"
        ) from None
    except (OSError, ValueError) as error:
        raise UsageError(f"{config_file}: unreadable ({error})") from None
    record = config.get(RECORD) if isinstance(config, dict) else None
    widths = record.get("ffn_widths") if isinstance(record, dict) else None
    if not (
        isinstance(widths, list)
        and widths
        and all(isinstance(w, int) and not isinstance(w, bool) and w > 0 for w in widths)
    ):
        raise UsageError(
            f"{config_file}: no geospec.ffn_widths (geospec's record of the per-layer FFN "
            "widths); load_pruned reads directories written by geospec prune or geospec export; "
            "load any other checkpoint with AutoModelForCausalLM.from_pretrained"
        )
    return widths


def set_widths(model: nn.Module, widths: Sequence[int]) -> None:
    """Make layer l's MLP ``widths[l]`` wide by keeping its first ``widths[l]`` neurons (new
    modules of the true shapes; their values are whatever was there, to be loaded over)."""
    layers = mlps(model)
    if len(layers) != len(widths):
        raise UsageError(f"{len(widths)} FFN widths for a model of {len(layers)} layers")
    for index, (mlp, width) in enumerate(zip(layers, widths, strict=True)):
        built = ffn_width(mlp)
        if width > built:
            raise UsageError(f"layer {index}: FFN width {width} exceeds the config's {built}")
        if width < built:
            cut_ffn(mlp, range(width))


def export_config(model: Any) -> Any:
    """A copy of ``model``'s config to save beside its exported weights: without the
    ``quantization_config`` a quantised source leaves on it (a GGUF's ``quant_method: gguf``),
    since the weights written are the live, de-quantised tensors; a loader that read it would
    look for a quantised file that is not there."""
    original: Any = model.config
    config = type(original).from_dict(original.to_dict())
    if getattr(config, "quantization_config", None) is not None:
        del config.quantization_config
    return config


def save_true_width(
    model: Any,
    widths: Sequence[int],
    directory: Path,
    note: str,
    zero_biases: Mapping[str, torch.Tensor] | None = None,
    dtype: torch.dtype | None = None,
) -> Stored:
    """Write ``model`` (a transformers model whose MLPs are at ``widths``, e.g. cut by
    :func:`geospec.prune.cut.pruned`) to the new ``directory`` at its true widths; atomic (a
    staging directory renamed into place). ``zero_biases`` (a compensated cut's:
    :func:`geospec.prune.hf_export.compensation_biases`) are stored beside its weights, and a
    Llama-family config says ``mlp_bias = True``. ``dtype``: the floating-point tensors' (None:
    the model's own), which the config then declares."""
    from geospec.storage.atomic import atomic_directory
    from geospec.version import __version__

    widths = [int(w) for w in widths]
    built = [ffn_width(mlp) for mlp in mlps(model)]
    if built != widths:
        raise UsageError(f"the model's FFN widths {built} are not the widths {widths} to store")
    config = export_config(model)
    setattr(config, width_key(config), max(widths))
    if zero_biases and hasattr(config, "mlp_bias"):
        config.mlp_bias = True  # Llama's; a family without the option: load_pruned adds them
    if dtype is not None:
        config.dtype = dtype  # transformers 5 writes it as "dtype" (4.x: torch_dtype)
    config.geospec = {  # RECORD, as geospec export records a trained model's widths
        "version": __version__,
        "ffn_widths": widths,
        "padded_to": None,
        "note": note,
    }
    true, padded = parameter_counts(model, widths)
    added = sum(t.numel() for t in (zero_biases or {}).values())  # stored as parameters too
    true, padded = true + added, padded + added
    with atomic_directory(directory) as work:
        config.save_pretrained(work)
        generation = getattr(model, "generation_config", None)
        if generation is not None:
            generation.save_pretrained(work)
        _save_weights(model, work / WEIGHTS_FILE, zero_biases or {}, dtype)
    return Stored(directory, widths, None, true, true, padded)


def _save_weights(
    model: Any, path: Path, extra: Mapping[str, torch.Tensor], dtype: torch.dtype | None = None
) -> None:
    """The state dict as one safetensors file, a tied tensor once (as save_pretrained does),
    floating-point tensors in ``dtype`` (None: as they are)."""
    from safetensors.torch import save_file

    def stored(tensor: torch.Tensor) -> torch.Tensor:
        tensor = tensor.detach().to("cpu")
        if dtype is not None and tensor.is_floating_point():
            tensor = tensor.to(dtype)
        return tensor.contiguous().clone()

    seen: set[int] = set()
    tensors: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        if tensor.data_ptr() in seen and tensor.numel() > 0:
            continue  # the tied copy (lm_head.weight): transformers ties it back on load
        seen.add(tensor.data_ptr())
        tensors[name] = stored(tensor)
    tensors |= {name: stored(tensor) for name, tensor in extra.items()}
    save_file(tensors, str(path), metadata={"format": "pt"})


def _read_weights(directory: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    index = directory / WEIGHTS_INDEX
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (directory / WEIGHTS_FILE).is_file():
        files = [WEIGHTS_FILE]
    else:
        raise UsageError(f"{directory}: no {WEIGHTS_FILE}; the export is incomplete")
    state: dict[str, torch.Tensor] = {}
    for name in files:
        state |= load_file(str(directory / name))
    return state


def load_pruned(path: str | Path, dtype: torch.dtype | None = None, device: str = "cpu") -> Any:
    """The pruned model in ``path`` as a plain transformers model, each layer's MLP at its true
    width, in eval mode on ``device`` (``dtype``: the stored one by default).

    ``path`` is a directory geospec wrote (``geospec prune`` with ``export``, ``geospec
    export``): true-width tensors are loaded as they are, a repair's bias on each FFN output
    projection included where the family's MLP has no bias option (Qwen2's: the module gets
    one); a padded checkpoint's zero units are dropped (each padded unit must be zero, or it is
    refused). A directory without geospec's
    width record is one :class:`UsageError` naming its config.json."""
    from transformers import AutoConfig, AutoModelForCausalLM

    directory = Path(path)
    widths = read_widths(directory)
    config: Any = AutoConfig.from_pretrained(str(directory), local_files_only=True)
    state = _read_weights(directory)
    stored = next((t.dtype for t in state.values() if t.is_floating_point()), torch.float32)
    dtype = dtype or stored
    # Built without initialising (its tensors untouched, so not resident) and with its MLPs on
    # the meta device at their true widths; the loaded tensors are assigned in place of all of
    # them, so the peak memory is about one copy of the weights.
    with _no_init():
        model: Any = AutoModelForCausalLM.from_config(config, dtype=dtype)
    for mlp in mlps(model):
        mlp.to("meta")
    set_widths(model, widths)
    _output_biases(model, state)
    expected = model.state_dict()
    config_file = directory / CONFIG_FILE
    for name, tensor in list(state.items()):
        want = expected.get(name)
        if tensor.is_floating_point() and tensor.dtype != dtype:
            tensor = state[name] = tensor.to(dtype)
        if want is None or tuple(want.shape) == tuple(tensor.shape):
            continue
        state[name] = _unpadded(tensor, tuple(want.shape), name, config_file)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    if set(missing) - tied or unexpected:
        raise UsageError(
            f"{directory}: the weights do not match {config_file} (missing "
            f"{sorted(set(missing) - tied)[:3]}, unexpected {sorted(unexpected)[:3]}); export "
            "it again"
        )
    if tied:
        model.tie_weights()
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise UsageError(
            f"{directory}: no weights for {left[:3]} in {WEIGHTS_FILE}; export it again"
        )
    return model.to(device).eval()


def _output_biases(model: nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Give each FFN output projection the bias ``state`` stores for it where the family's MLP
    is built without one (Qwen2, Mistral, Gemma: a repair's bias, :mod:`geospec.prune.
    hf_export`), on the meta device, to be loaded over like every tensor."""
    names = {id(module): name for name, module in model.named_modules()}
    for mlp in mlps(model):
        output = ffn_layout(mlp).output
        module = getattr(mlp, output)
        if f"{names[id(mlp)]}.{output}.bias" in state and getattr(module, "bias", None) is None:
            module.bias = nn.Parameter(torch.empty(module.weight.shape[0], device="meta"))


def _no_init() -> Any:
    """transformers' context that builds a model without initialising its weights (transformers
    5: ``transformers.initialization``; 4.x: ``modeling_utils``)."""
    import contextlib
    import importlib

    for module in ("transformers.initialization", "transformers.modeling_utils"):
        try:
            context = getattr(importlib.import_module(module), "no_init_weights", None)
        except ImportError:
            continue
        if context is not None:
            return context()
    return contextlib.nullcontext()


def _unpadded(
    tensor: torch.Tensor, shape: tuple[int, ...], name: str, config_file: Path
) -> torch.Tensor:
    """``tensor`` cut to ``shape`` where it is a padded FFN projection (longer along one axis,
    the extra units exactly zero); anything else disagrees with the recorded widths."""
    axes = [
        i for i, (have, want) in enumerate(zip(tensor.shape, shape, strict=False)) if have != want
    ]
    if len(tensor.shape) != len(shape) or len(axes) != 1 or tensor.shape[axes[0]] < shape[axes[0]]:
        raise UsageError(
            f"{config_file}: {name} has shape {list(tensor.shape)} but geospec.ffn_widths "
            f"gives {list(shape)}; the per-layer widths disagree with the tensors"
        )
    axis = axes[0]
    kept, extra = tensor.split([shape[axis], tensor.shape[axis] - shape[axis]], dim=axis)
    if extra.count_nonzero() > 0:
        raise UsageError(
            f"{config_file}: {name} has non-zero units beyond the width geospec.ffn_widths "
            "gives; the per-layer widths disagree with the tensors"
        )
    return kept.contiguous()
