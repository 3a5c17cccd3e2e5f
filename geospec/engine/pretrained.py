"""Loading a pretrained Hugging Face causal LM from local files (a directory or a GGUF file)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from geospec.engine.tokenizer import load_error
from geospec.errors import UsageError


def load_pretrained(path: str | Path, device: str = "cpu", trust_remote_code: bool = False) -> Any:
    """A causal LM in float32 and eval mode, from a local directory or a ``.gguf`` file.

    Nothing is downloaded (``local_files_only``). Code shipped with the checkpoint (``auto_map``)
    runs only with ``trust_remote_code``; weights are read from safetensors files where the
    checkpoint has them. GGUF files are de-quantised by transformers (which needs the ``gguf``
    package). Every load failure is one :class:`UsageError` naming the path.
    """
    import torch
    from transformers import AutoModelForCausalLM

    path = Path(path)
    kwargs: dict[str, Any] = {
        "local_files_only": True,
        "dtype": torch.float32,
        "trust_remote_code": trust_remote_code,
    }
    try:
        if path.suffix == ".gguf":
            model = AutoModelForCausalLM.from_pretrained(
                str(path.parent), gguf_file=path.name, **kwargs
            )
        else:
            model = AutoModelForCausalLM.from_pretrained(str(path), **kwargs)
    except Exception as error:  # transformers raises many kinds; each is about the user's files
        raise UsageError(
            f"reference.checkpoint: cannot load {path} as a causal LM: {load_error(error)}"
        ) from None
    return model.to(device).eval()  # type: ignore[arg-type]


def hidden_width(model: Any) -> int:
    """The residual-stream width, read from the input embedding."""
    embedding = model.get_input_embeddings()
    return int(embedding.embedding_dim)
