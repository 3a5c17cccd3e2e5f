"""GGUF files scored where they run: each file's perplexity in llama.cpp on a spec's prune eval
windows (the token windows geospec scores: :func:`geospec.prune.corpora.eval_batches`) and its
greedy continuations of the fixed prompts (``geospec.prune.select.PROMPTS``) there. A file given
with the true-width model directory it was written from is also scored as geospec reads it (its
de-quantized weights, :func:`geospec.prune.gguf_weights.shipped_losses`) beside that float32
model, and the float32 model continues the prompts too.

    python scripts/shipped_files.py SPEC --file unpruned=source.gguf \
        --file before=before.gguf@runs/R/prune/keep-0.5/ARM/seed-0/model --json out.json

docs/results/smollm2-135m-heal-shipped runs it on a file before and after ``geospec heal``.
Needs llama-cpp-python; prints a markdown table and the continuations.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console

from geospec.engine.distributed import context
from geospec.pipeline.context import RunContext
from geospec.prune.continuations import CONTINUATION_TOKENS, greedy
from geospec.prune.corpora import eval_batches
from geospec.prune.gguf_weights import shipped_losses
from geospec.prune.select import PROMPTS, prompt_ids
from geospec.prune.true_width import load_pruned
from geospec.spec.loading import load_spec


def llamacpp_losses(llm: Any, batches: list[Any]) -> float:
    """The mean next-token loss of the loaded file on ``batches`` (each window evaluated alone,
    from an empty cache, every position's logits kept)."""
    losses = []
    for inputs, targets in batches:
        for window, following in zip(inputs.tolist(), targets.tolist(), strict=True):
            llm.reset()
            llm.eval(window)
            logits = np.asarray(llm.scores[: len(window)], dtype=np.float64)
            top = logits.max(axis=1, keepdims=True)
            log_z = top[:, 0] + np.log(np.exp(logits - top).sum(axis=1))
            picked = logits[np.arange(len(window)), following]
            losses.append(float(np.mean(log_z - picked)))
    return float(np.mean(losses))


def llamacpp_greedy(llm: Any, prompt: list[int], stop: int | None) -> list[int]:
    """The prompt's :data:`CONTINUATION_TOKENS` most likely next tokens in llama.cpp, as
    :func:`geospec.prune.continuations.greedy` takes them."""
    llm.reset()
    llm.eval(prompt)
    found: list[int] = []
    for _ in range(CONTINUATION_TOKENS):
        token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        found.append(token)
        if token == stop:
            break
        llm.eval([token])
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", type=Path)
    parser.add_argument(
        "--file",
        action="append",
        required=True,
        metavar="NAME=FILE.gguf[@MODEL_DIR]",
        help="a GGUF file to score, with the true-width directory it was written from",
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()

    import llama_cpp

    torch.set_num_threads(args.threads)
    spec = load_spec(args.spec, ())
    assert spec.prune is not None, f"{args.spec}: no [prune] section"
    run = RunContext(
        Path(spec.run_dir), args.spec.parent, Console(stderr=True), context(), "cpu",
        spec_path=args.spec,
    )  # fmt: skip
    corpora = eval_batches(spec.prune.eval, spec.data, spec.model.seq_len, run.token_data, "cpu")
    data = run.token_data(spec.data)
    tokenizer = data.tokenizer()
    prompts = prompt_ids(tokenizer, data.bos_id)

    found: dict[str, Any] = {"corpora": list(corpora), "prompts": list(PROMPTS), "files": {}}
    for given in args.file:
        name, _, rest = given.partition("=")
        path, _, model_dir = rest.partition("@")
        llm = llama_cpp.Llama(
            model_path=path, n_ctx=spec.model.seq_len + 8, n_batch=spec.model.seq_len,
            n_threads=args.threads, n_threads_batch=args.threads, logits_all=True, verbose=False,
        )  # fmt: skip
        entry: dict[str, Any] = {
            "file": Path(path).name,
            "bytes": Path(path).stat().st_size,
            "llamacpp": {c: llamacpp_losses(llm, b) for c, b in corpora.items()},
            "llamacpp_continuations": [
                tokenizer.decode(llamacpp_greedy(llm, p, data.eot_id)) for p in prompts
            ],
        }
        del llm
        if model_dir:
            entry["geospec"] = {
                c: shipped_losses(Path(model_dir), Path(path), b) for c, b in corpora.items()
            }
            model = load_pruned(Path(model_dir), dtype=torch.float32)
            entry["float32_continuations"] = [
                tokenizer.decode(ids) for ids in greedy(model, prompts, data.eot_id)
            ]
        found["files"][name] = entry
    if args.json:
        args.json.write_text(json.dumps(found, indent=1) + "\n")
    print(markdown(found))


def markdown(found: dict[str, Any]) -> str:
    """The perplexities as a table (llama.cpp's; geospec's of the de-quantized file and of the
    float32 model where given) and each file's continuations."""
    corpora = found["corpora"]
    lines = [
        "| file | bytes | how | " + " | ".join(corpora) + " |",
        "|---|---|---|" + "---|" * len(corpora),
    ]
    for name, entry in found["files"].items():
        rows = [("llama.cpp", entry["llamacpp"])]
        if "geospec" in entry:
            rows.append(
                (
                    "geospec, the file's weights",
                    {c: v["shipped"] for c, v in entry["geospec"].items()},
                )
            )
            rows.append(
                ("geospec, float32 model", {c: v["float32"] for c, v in entry["geospec"].items()})
            )
        for how, losses in rows:
            cells = " | ".join(f"{math.exp(losses[c]):.2f}" for c in corpora)
            lines.append(f"| {name} | {entry['bytes']:,} | {how} | {cells} |")
    lines.append("")
    for index, prompt in enumerate(found["prompts"]):
        lines.append(f"- `{prompt}`")
        for name, entry in found["files"].items():
            said = entry["llamacpp_continuations"][index].strip().replace("\n", " ")
            lines.append(f"  - {name} (llama.cpp): `{said}`")
            if "float32_continuations" in entry:
                said = entry["float32_continuations"][index].strip().replace("\n", " ")
                lines.append(f"  - {name} (float32 model): `{said}`")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
