"""Loading a pretrained Hugging Face causal LM: a local directory, a GGUF file, or a hub id at a
pinned commit (:mod:`geospec.hub`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from geospec.engine.tokenizer import load_error
from geospec.errors import UsageError
from geospec.hub import Source, locate

DTYPES = ("float32", "bfloat16", "float16")


def load_pretrained(
    source: Source | str | Path,
    device: str = "cpu",
    trust_remote_code: bool = False,
    dtype: str = "float32",
) -> Any:
    """A causal LM in ``dtype`` and eval mode on ``device``.

    Low memory: transformers builds the model without initialising weights, reads safetensors
    memory-mapped and casts each tensor to ``dtype`` as it loads it (straight onto a GPU through
    ``device_map``), so the peak is about one copy of the weights in ``dtype`` plus the runtime
    (docs/pretrained.md). GGUF files are de-quantised by transformers (the ``gguf`` extra: gguf
    and accelerate). Code shipped with the checkpoint (``auto_map``) runs only with
    ``trust_remote_code``. Every load failure is one
    :class:`UsageError` naming the checkpoint.
    """
    import torch
    from transformers import AutoModelForCausalLM

    if not isinstance(source, Source):
        source = locate(str(source), None, Path.cwd(), "reference.checkpoint")
    if dtype not in DTYPES:
        raise UsageError(f"reference.dtype: {dtype!r} is not one of {', '.join(DTYPES)}")
    location, keywords = source.from_pretrained_args()
    quiet_progress_bars(gguf="gguf_file" in keywords)
    low_memory = _low_memory_loading()
    if low_memory:  # transformers 5 always loads this way and ignores the flag; 4.x needs it
        keywords["low_cpu_mem_usage"] = True
    placed = device != "cpu" and low_memory
    if placed:
        keywords["device_map"] = device
    try:
        model = AutoModelForCausalLM.from_pretrained(
            location,
            dtype=getattr(torch, dtype),
            trust_remote_code=trust_remote_code,
            **keywords,
        )
    except Exception as error:  # transformers raises many kinds; each is about the user's files
        raise UsageError(
            f"{source.field}: cannot load {source} as a causal LM: {load_error(error)}"
        ) from None
    return (model if placed else model.to(device)).eval()  # type: ignore[arg-type]


def quiet_progress_bars(gguf: bool = False) -> None:
    """Keep transformers' progress bars (loading weights, writing shards; through it
    huggingface_hub's downloads; with ``gguf``, de-quantising a GGUF file's tensors) out of
    logs: off for the process unless stderr is a terminal, where a live bar is useful.
    geospec's own lines say what each stage does."""
    import sys

    if sys.stderr.isatty():
        return
    from transformers.utils import logging

    logging.disable_progress_bar()
    if gguf:  # its bar is tqdm's own, which transformers' switch does not reach
        import functools

        from transformers import modeling_gguf_pytorch_utils as converting

        bar = getattr(converting, "tqdm", None)
        if bar is not None and not isinstance(bar, functools.partial):
            converting.tqdm = functools.partial(bar, disable=True)


def _low_memory_loading() -> bool:
    """Whether ``from_pretrained`` can build the model without initialising it and put the weights
    straight on a device (``device_map``): transformers 5 does itself, earlier releases only with
    accelerate installed."""
    import importlib.util

    import transformers

    major = int(transformers.__version__.split(".")[0])
    return major >= 5 or importlib.util.find_spec("accelerate") is not None


def hidden_width(model: Any) -> int:
    """The residual-stream width, read from the input embedding."""
    embedding = model.get_input_embeddings()
    return int(embedding.embedding_dim)
