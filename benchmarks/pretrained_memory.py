"""Peak memory of loading and probing a pretrained checkpoint, per layer, extrapolated to 7B.

Builds Mistral-7B-shaped checkpoints (d_model 4096, FFN 14336, 32 heads, 8 key/value heads,
vocabulary 32768, untied head) with random weights and only a few layers, saves each as
safetensors in the dtype it is probed in, and runs ``geospec run SPEC --until probe`` on it
(reference.dtype = that dtype) in a fresh process whose peak resident memory (VmHWM) is read at
its end. A least-squares line through the peaks gives the memory per layer and the fixed part
(embeddings, head, Python, torch, transformers); 32 layers of it is the Mistral-7B estimate.
The probe is small (seq_len 32: activations are negligible next to the weights); docs/pretrained.md
adds the activations of a full probe.

    python benchmarks/pretrained_memory.py                          # bf16 at 1, 2, 4, 8 layers
    python benchmarks/pretrained_memory.py --layers 1 2 --dtype float32
    python benchmarks/pretrained_memory.py --gguf model.gguf --dtype float32 bfloat16   # load only

Prints one row per checkpoint and, per dtype, ``per_layer_gib: X  fixed_gib: Y
mistral_7b_gib: Z``. Needs disk for the largest checkpoint (8 layers bf16: 4 GB) and takes a few
minutes of one CPU core per checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

MISTRAL_7B = {
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 32768,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": False,
}
LAYERS_7B = 32
GIB = 2**30


def build_checkpoint(directory: Path, layers: int, dtype: str) -> int:
    """A random Mistral-shaped model with ``layers`` layers and a word-level tokenizer of its
    vocabulary in ``directory``; returns its parameter count."""
    import torch
    import transformers as hf
    from tokenizers import Tokenizer, models, pre_tokenizers

    hf.utils.logging.disable_progress_bar()
    vocab_size = MISTRAL_7B["vocab_size"]
    vocab = {"[UNK]": 0, "</s>": 1} | {f"w{i}": i + 2 for i in range(vocab_size - 2)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    hf.PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="</s>", unk_token="[UNK]"
    ).save_pretrained(directory)
    config = hf.MistralConfig(
        num_hidden_layers=layers, bos_token_id=0, eos_token_id=1, **MISTRAL_7B
    )
    torch.manual_seed(0)
    model = hf.MistralForCausalLM._from_config(config, dtype=getattr(torch, dtype))
    model.save_pretrained(directory)
    count = sum(p.numel() for p in model.parameters())
    del model
    return count


def write_spec(directory: Path, checkpoint: Path, dtype: str) -> Path:
    import numpy as np
    import tomlkit

    rng = np.random.default_rng(0)
    words = [" ".join(f"w{j}" for j in rng.integers(0, 2000, 400)) for _ in range(20)]
    (directory / "docs.jsonl").write_text("\n".join(json.dumps({"text": w}) for w in words))
    spec = {
        "name": "memory",
        "out": str(directory / "run"),
        "probe_only": True,
        "model": {
            "n_layers": LAYERS_7B,
            "d_model": 4096,
            "n_heads": 32,
            "n_kv_heads": 8,
            "ffn_width": 14336,
            "activation": "swiglu",
            "seq_len": 32,
            "vocab_size": MISTRAL_7B["vocab_size"],
            "multiple_of": 256,
            "norm": "rmsnorm",
            "positions": "rope",
            "tie_embeddings": False,
            "bias": False,
        },
        "data": {
            "files": ["docs.jsonl"],
            "val_fraction": 1.0,
            "tokenizer": {"kind": "pretrained", "path": str(checkpoint)},
        },
        "reference": {"checkpoint": str(checkpoint), "dtype": dtype},
        "probe": {"tokens": 16, "batch_size": 2, "skip_first": 1},
        "measure": [{"geometry": {"kind": "raw"}, "statistic": {"kind": "shift"}}],
        "arms": [{"name": "uniform", "schedule": {"kind": "uniform"}}],
        "train": {"steps": 1, "device": "cpu", "threads": 1},
    }
    path = directory / "spec.toml"
    path.write_text(tomlkit.dumps(spec))
    return path


def peak_kib() -> int:
    """This process's peak resident memory so far (VmHWM), in KiB."""
    status = Path("/proc/self/status").read_text()
    return next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM"))


def child(spec: str) -> None:
    """Runs the probe in this process, then prints this process's peak resident memory."""
    from geospec.cli import cli

    try:
        cli.main(["run", spec, "--until", "probe"], standalone_mode=False)
    finally:
        print(f"PEAK_KIB {peak_kib()}", flush=True)


def child_load(path: str, dtype: str) -> None:
    """Loads a checkpoint as the reference stage does, then prints the peak resident memory."""
    from geospec.engine.pretrained import load_pretrained

    try:
        model = load_pretrained(path, dtype=dtype)
        print(f"PARAMS {sum(p.numel() for p in model.parameters())}", flush=True)
    finally:
        print(f"PEAK_KIB {peak_kib()}", flush=True)


def peak_of(*arguments: str) -> tuple[float, str]:
    """Peak resident memory (GiB) of a fresh process running this script with ``arguments``
    (loading a checkpoint, or loading and probing it), and its output."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, __file__, *arguments], env=env, capture_output=True, text=True
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("PEAK_KIB")]
    if done.returncode != 0 or not lines:
        sys.exit(f"{arguments} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return int(lines[-1].split()[1]) * 1024 / GIB, done.stdout


def fit(layers: list[int], peaks: list[float]) -> tuple[float, float]:
    """Least-squares slope (per layer) and intercept (fixed part)."""
    import numpy as np

    slope, intercept = np.polyfit(np.array(layers, float), np.array(peaks, float), 1)
    return float(slope), float(intercept)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--dtype", nargs="+", default=["bfloat16"])
    parser.add_argument("--gguf", help="instead: the peak of loading this GGUF file per dtype")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--child-load", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return
    if args.child_load:
        child_load(args.child_load, args.dtype[0])
        return
    bytes_per = {"float32": 4, "bfloat16": 2, "float16": 2}
    if args.gguf:
        print(f"loading {args.gguf}")
        print(f"{'dtype':>9} {'params':>14} {'weights GiB':>11} {'peak GiB':>9}")
        for dtype in args.dtype:
            peak, output = peak_of("--child-load", args.gguf, "--dtype", dtype)
            count = int(next(x for x in output.splitlines() if x.startswith("PARAMS")).split()[1])
            weights = count * bytes_per[dtype] / GIB
            print(f"{dtype:>9} {count:>14,} {weights:>11.2f} {peak:>9.2f}", flush=True)
        return
    print(f"{'dtype':>9} {'layers':>6} {'params':>14} {'weights GiB':>11} {'peak GiB':>9}")
    for dtype in args.dtype:
        peaks = []
        for layers in args.layers:
            directory = Path(tempfile.mkdtemp(prefix="geospec-memory-"))
            try:
                count = build_checkpoint(directory / "model", layers, dtype)
                peak, _ = peak_of("--child", str(write_spec(directory, directory / "model", dtype)))
            finally:
                shutil.rmtree(directory, ignore_errors=True)
            peaks.append(peak)
            weights = count * bytes_per[dtype] / GIB
            print(f"{dtype:>9} {layers:>6} {count:>14,} {weights:>11.2f} {peak:>9.2f}", flush=True)
        if len(args.layers) >= 2:
            per_layer, fixed = fit(args.layers, peaks)
            estimate = fixed + LAYERS_7B * per_layer
            print(
                f"{dtype}: per_layer_gib: {per_layer:.3f}  fixed_gib: {fixed:.2f}  "
                f"mistral_7b_gib: {estimate:.1f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
