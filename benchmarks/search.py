"""Benchmark: the evolutionary search allocation (``evolve``) on SmolLM2-135M on this machine.

Loads SmolLM2-135M's GGUF (``--gguf PATH``, the gguf extra; without it a Llama of SmolLM2's
shape with random weights; ``--tiny``: a Llama of 4 small layers, to check the script), scores
the neurons (activation) on ``--windows`` calibration windows of ``--seq-len`` tokens, and runs
``--generations`` generations of the search at ``--keep`` from uniform, as the prune stage runs
it (KL fitness, each candidate from its first changed layer), once per way of cutting a
candidate (``--cuts``: at its true widths, the default, and with zeroed activations at full
width), the same seed each time. Prints each generation's line, then per cut the seconds per
generation, the share of them spent scoring candidates (the forward passes, the unpruned
model's log-probabilities included), the tokens scored per second against plain transformers'
forward of the same model pruned at its true widths, what a search of 150 generations would
take, and each cut's time against the last one's:

    cut true: generation_s: 9.8  scoring_share: 0.97  tokens_per_s: 1050  plain_tokens_per_s: 1230
    search_150_min: 24.5
    generation time against cut zero: true 0.80x  zero 1.00x

A generation scores ``offspring x stage 1 + (survivors + parent) x later stages`` tokens (the
defaults: about 10k); size the stages from that and from the fitness's noise.
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from geospec.kinds import Fitness, Search
from geospec.measure.probe import find_ffn_sites
from geospec.measure.sensitivity import logits_of
from geospec.plugin import create_plugin
from geospec.prune.apply import calibration_windows, eval_loss, neuron_scores, pruned
from geospec.prune.search import CalibrationFitness, SealedSearchState, calibration_batches
from geospec.shapes.pruned import pruned_dims


def model_of(gguf: str | None, tiny: bool) -> torch.nn.Module:
    import transformers as hf

    if gguf:
        path = Path(gguf)
        return hf.AutoModelForCausalLM.from_pretrained(
            path.parent, gguf_file=path.name, dtype=torch.float32
        ).eval()
    torch.manual_seed(0)
    shape = (
        {"vocab_size": 512, "hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": 4}
        if tiny
        else {
            "vocab_size": 49152,
            "hidden_size": 576,
            "intermediate_size": 1536,
            "num_hidden_layers": 30,
        }
    )
    config = hf.LlamaConfig(
        num_attention_heads=4 if tiny else 9,
        num_key_value_heads=2 if tiny else 3,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        **shape,
    )
    return hf.LlamaForCausalLM(config).eval()


class TimedFitness:
    """A fitness that counts the seconds and tokens it scored."""

    def __init__(self, fitness: CalibrationFitness) -> None:
        self.fitness = fitness
        self.windows, self.window_tokens = fitness.windows, fitness.window_tokens
        self.seconds, self.tokens = 0.0, 0

    def __call__(
        self,
        candidates: Sequence[Sequence[int]],
        windows: Sequence[int],
        base: Sequence[int] | None = None,
    ) -> list[float]:
        started = time.perf_counter()
        values = self.fitness(candidates, windows, base)
        self.seconds += time.perf_counter() - started
        self.tokens += len(candidates) * len(windows) * self.window_tokens
        return values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gguf", help="SmolLM2-135M's GGUF file (default: random weights)")
    parser.add_argument("--tiny", action="store_true", help="a tiny Llama (checks the script)")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--windows", type=int, default=16, help="calibration windows")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--keep", type=float, default=0.5)
    parser.add_argument("--generations", type=int, default=3)
    parser.add_argument("--offspring", type=int, default=16)
    parser.add_argument(
        "--stages", default="256:2,2048:1", help="tokens:survivors per stage (the defaults)"
    )
    parser.add_argument(
        "--cuts",
        default="true,zero",
        help="how candidates are cut, each timed in turn: true widths, zeroed activations",
    )
    parser.add_argument("--threads", type=int, default=2, help="torch threads (2: both cores)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    model = model_of(args.gguf, args.tiny)
    config = model.config
    layers, d_model = config.num_hidden_layers, config.hidden_size
    width, multiple = config.intermediate_size, 8 if args.tiny else 64
    tokens = np.random.default_rng(0).integers(0, config.vocab_size, (args.windows + 1) * 600)
    starts = calibration_windows(tokens, args.seq_len, args.windows, 0)
    batches = calibration_batches(
        tokens, starts, args.seq_len, args.batch_size, torch.device("cpu")
    )
    sites = find_ffn_sites(model, d_model, lambda: logits_of(model, batches[0][0][:1]))
    importance = create_plugin("importance", {"kind": "activation"})
    scores, orders = neuron_scores(
        model, sites, importance, tokens, starts, args.seq_len, args.batch_size
    )
    dims = pruned_dims(layers, d_model, width, multiple, args.keep, "swiglu")
    stages = [
        {"tokens": int(t), "survivors": int(s)}
        for t, s in (stage.split(":") for stage in args.stages.split(","))
    ]
    schedule = create_plugin(
        "schedule",
        {
            "kind": "evolve",
            "generations": args.generations,
            "offspring": args.offspring,
            "stages": stages,
        },
    )
    print(
        f"{args.gguf or ('a tiny Llama' if args.tiny else 'random weights, SmolLM2 shape')}: "
        f"{args.windows} calibration windows of {args.seq_len}; keep {args.keep}; "
        f"{args.generations} generations of {args.offspring} offspring, stages {stages}; "
        f"{torch.get_num_threads()} threads",
        flush=True,
    )
    cuts = args.cuts.split(",")
    found: dict[str, tuple[float, TimedFitness, list[int]]] = {}
    teacher: dict[int, torch.Tensor] = {}  # the unpruned log-probabilities, shared as a prune does
    for cut in cuts:
        scorer = CalibrationFitness(
            model, sites, orders, batches, "kl", args.batch_size, teacher, cut
        )
        scorer.prepare(range(scorer.windows))  # every cut timed without the teacher's passes
        timed = TimedFitness(scorer)

        def fitness(kind: str, timed: TimedFitness = timed) -> Fitness:
            return timed

        with tempfile.TemporaryDirectory() as directory:
            state = SealedSearchState(
                Path(directory) / "search.json", "benchmark", print, f"cut {cut}", args.generations
            )
            started = time.perf_counter()
            widths = schedule.widths_from_search(dims, scores, {}, Search(fitness, state))
            found[cut] = (time.perf_counter() - started, timed, list(widths))
    # plain transformers' forward of the same model at its true widths, on as many windows as
    # the last stage scores
    widths = found[cuts[0]][2]
    with torch.no_grad(), pruned(sites, orders, widths):
        plain_started = time.perf_counter()
        eval_loss(model, batches)
        plain = time.perf_counter() - plain_started
    plain_tokens = sum(targets.numel() for _, targets in batches)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"searched widths ({cuts[0]}): {widths}")
    if len(cuts) > 1:
        same = all(found[cut][2] == widths for cut in cuts)
        print(f"the same widths from every cut: {same}")
    for cut in cuts:
        total, timed, _ = found[cut]
        generation = total / args.generations
        print(
            f"cut {cut}: generation_s: {generation:.1f}  scoring_share: "
            f"{timed.seconds / total:.2f}  tokens_per_s: {timed.tokens / timed.seconds:.0f}  "
            f"plain_tokens_per_s: {plain_tokens / plain:.0f}  "
            f"search_150_min: {150 * generation / 60:.1f}"
        )
    if len(cuts) > 1:
        base = found[cuts[-1]][0]
        print(
            "generation time against cut " + cuts[-1] + ": "
            + "  ".join(f"{cut} {found[cut][0] / base:.2f}x" for cut in cuts)
        )  # fmt: skip
    print(f"peak_rss_gb: {peak:.2f}")


if __name__ == "__main__":
    main()
