"""How far a process's resident memory rises while the engine heals a pruned model by
distillation (train_model with a teacher, as prune.heal runs it), measured in a process of its
own: tests/test_memory.py runs this file as a script with glibc's allocator pinned to the state
a long-running process reaches, so what ran before in the test session cannot change it.

    python tests/healing_peak.py DIRECTORY DIMS_JSON WIDTH BATCH

prints the rise in bytes. DIMS_JSON holds GPTConfig's vocab_size, n_layers, d_model and seq_len;
WIDTH is the unpruned FFN width (the pruned model has half), BATCH the sequences a step.
"""

from __future__ import annotations

import gc
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from small_spec import small_spec

from geospec.engine.distill import Teacher
from geospec.engine.model import GPT, GPTConfig
from geospec.engine.token_data import TokenData, prepare_data
from geospec.engine.train import train_model
from geospec.spec.loading import load_spec
from geospec.spec.sections import TrainSpec


def healing_config(dims: dict[str, int], ffn_width: int, **changes: int) -> GPTConfig:
    """A model of ``dims`` (``changes`` replacing some) with FFN width ``ffn_width`` in every
    layer, shaped as imported checkpoints are: swiglu, rmsnorm, rope, grouped-query attention,
    no biases."""
    return GPTConfig(
        **(dims | changes), n_heads=4, n_kv_heads=2, ffn_widths=[ffn_width] * dims["n_layers"],
        activation="swiglu", norm="rmsnorm", positions="rope", bias=False,
    )  # fmt: skip


def status_bytes(field: str) -> int:
    """A field of Linux's /proc/self/status (VmRSS: resident now; VmHWM: its peak), in bytes."""
    found = re.search(rf"^{field}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.M)
    assert found is not None
    return int(found.group(1)) * 1024


def peak_during(call: Callable[[], object]) -> int:
    """How far this process's resident memory rose above where it stood while ``call`` ran (the
    kernel's peak reset first: /proc/self/clear_refs)."""
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")
    before = status_bytes("VmRSS")
    call()
    return status_bytes("VmHWM") - before


def small_data(directory: Path) -> TokenData:
    """small_spec's corpus with its BPE of 300 ids (the models' vocabularies may be larger)."""
    directory.mkdir(parents=True, exist_ok=True)
    spec = directory / "spec.toml"
    spec.write_text(small_spec("heal", {"steps": 1}, arms=("uniform",)))
    return prepare_data(load_spec(spec).data, directory / "data", spec_dir=directory)


def healing_peak(directory: Path, dims: dict[str, int], width: int, batch: int) -> int:
    """The rise of resident memory while 2 steps of ``batch`` sequences heal the pruned model
    (the teacher and the imported weights exist before, as in a prune's process)."""
    torch.set_num_threads(1)
    data = small_data(directory)
    full, pruned = healing_config(dims, width), healing_config(dims, width // 2)
    teacher = Teacher(GPT(full).eval(), "digest", 1.0)
    initial = {k: v.detach() for k, v in GPT(pruned).state_dict().items()}
    # torch's and the engine's first use (their modules, thread pools, kernels) is not healing's
    tiny = healing_config(dims, 8, vocab_size=300, d_model=16)
    warm = TrainSpec(steps=2, batch_size=2, device="cpu", eval_tokens=dims["seq_len"])
    teaches = Teacher(GPT(tiny).eval(), "digest", 1.0)
    train_model(warm, tiny, data, directory / "warm", seed=0, progress=False, teacher=teaches)

    train = TrainSpec(steps=2, batch_size=batch, device="cpu", eval_tokens=dims["seq_len"])

    def heal() -> object:
        return train_model(
            train, pruned, data, directory / "healed", seed=0, progress=False, initial=initial,
            teacher=teacher,
        )  # fmt: skip

    return peak_during(heal)


if __name__ == "__main__":
    where, dims, width, batch = sys.argv[1:]
    print(healing_peak(Path(where), json.loads(dims), int(width), int(batch)))
