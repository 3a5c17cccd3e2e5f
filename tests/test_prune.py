"""Pruning (geospec.prune): widths at a pruned budget, the pruned model's export as a plain
transformers checkpoint (reloaded and recomputed with transformers alone), and its loss."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hf_models
import numpy as np
import pytest
import tomlkit
import torch
import torch.nn.functional as F
import transformers as hf
from click.testing import CliRunner

import geospec
from geospec.cli import cli
from geospec.errors import UsageError
from geospec.measure.calibration import calibration_stats
from geospec.measure.probe import find_ffn_sites
from geospec.measure.sensitivity import logits_of
from geospec.plugin import create_plugin
from geospec.prune.allocate import allocate
from geospec.prune.cut import pruned
from geospec.prune.hf_export import compensated_export_problem, export_pruned
from geospec.prune.losses import eval_loss, ffn_parameters
from geospec.prune.score import calibration_windows, neuron_scores
from geospec.shapes.pruned import pruned_dims
from geospec.spec.sections import ArmSpec, PruneSpec

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_torch_thread")]


def arms(*tables: tuple[str, object]) -> list[ArmSpec]:
    return [ArmSpec.model_validate({"name": n, "schedule": s}) for n, s in tables]


def test_every_arm_has_the_pruned_budget_and_no_layer_grows() -> None:
    dims = pruned_dims(n_layers=4, d_model=32, width=64, multiple=8, keep=0.5, activation="swiglu")
    assert (dims.ffn_width, dims.budget, dims.max_width) == (32, 128, 64)
    scores = [[float((i * 7 + layer) % 13) for i in range(64)] for layer in range(4)]
    profiles = {"p": [4.0, 3.0, 2.0, 1.0]}
    widths = allocate(
        arms(
            ("uniform", "uniform"),
            ("flap", "flap"),
            ("owl", "owl_neuron"),
            ("cosine", {"kind": "cosine", "start": 1.5, "end": 0.5}),
            ("geometric", {"kind": "geometric", "profile": "p"}),
            ("sorted", {"kind": "sorted", "of": "geometric"}),
        ),
        dims,
        profiles,
        scores,
    )
    assert widths["uniform"] == [32] * 4
    for name, values in widths.items():
        assert sum(values) == 128 and all(8 <= w <= 64 and w % 8 == 0 for w in values), name
    assert widths["geometric"][0] >= widths["geometric"][-1]


def test_each_score_allocation_reads_its_own_arms_scores() -> None:
    """arm_scores gives an arm the scores of its own importance: flap on scores that favour
    layer 0 gives layer 0 more, the same flap on the reverse scores gives layer 1 more."""
    dims = pruned_dims(n_layers=2, d_model=8, width=16, multiple=1, keep=0.5, activation="gelu")
    steep = [[float(i * i) for i in range(16)], [float(i) for i in range(16)]]
    table = arms(("a", "flap"), ("b", "flap"), ("c", "flap"))
    widths = allocate(table, dims, {}, steep, arm_scores={"b": steep[::-1]})
    assert widths["a"] == widths["c"] and widths["b"] == widths["a"][::-1]
    assert widths["a"][0] != widths["a"][1]


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_the_block_calibration_gathers_every_linears_input_rms(family: str) -> None:
    """Every linear map of each decoder layer, weights out x in (GPT-2's Conv1D transposed);
    layer 0's attention input is the first norm of the embeddings, whose RMS per feature over
    the calibration tokens is computed here by hand."""
    from geospec.measure.calibration import calibrate

    model = hf_models.llama() if family == "llama" else hf_models.gpt2()
    tokens = np.random.default_rng(0).integers(0, hf_models.VOCAB, 400)
    starts = calibration_windows(tokens, 16, 6, seed=0)
    sites = find_ffn_sites(
        model, hf_models.WIDTH, lambda: logits_of(model, torch.zeros(1, 4, dtype=torch.long))
    )
    blocks = calibrate(model, sites, tokens, starts, 16, 4, stats=False, blocks=True).blocks
    assert blocks is not None and [b.layer for b in blocks] == [0, 1, 2]
    names = [linear.name for linear in blocks[0].linears]
    ids = torch.as_tensor(np.stack([tokens[s : s + 16] for s in starts]))
    with torch.no_grad():
        if family == "llama":
            assert names == [
                "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
            ]  # fmt: skip
            x = model.model.layers[0].input_layernorm(model.model.embed_tokens(ids))
            shapes = {"mlp.down_proj": (hf_models.WIDTH, 80), "mlp.up_proj": (80, hf_models.WIDTH)}
        else:
            assert names == ["attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"]
            embedded = model.transformer.wte(ids) + model.transformer.wpe(torch.arange(16))
            x = model.transformer.h[0].ln_1(embedded)
            shapes = {"mlp.c_fc": (4 * hf_models.WIDTH, hf_models.WIDTH)}
    rms = x.double().square().mean(dim=(0, 1)).sqrt()
    torch.testing.assert_close(blocks[0].linears[0].input_rms, rms, atol=1e-6, rtol=1e-5)
    for linear in blocks[0].linears:
        assert linear.input_rms.shape == (linear.weight.shape[1],)
        if linear.name in shapes:
            assert tuple(linear.weight.shape) == shapes[linear.name]


def test_a_schedule_that_would_grow_a_layer_is_refused_by_name() -> None:
    dims = pruned_dims(4, 32, 64, 8, keep=0.75, activation="gelu")  # uniform 48
    with pytest.raises(UsageError, match=r"prune arm 'steep'.*layer 0 would grow to 80"):
        allocate(arms(("steep", {"kind": "cosine", "start": 1.7, "end": 0.3})), dims, {}, [])
    with pytest.raises(UsageError, match="below one multiple"):
        pruned_dims(4, 32, 64, 16, keep=0.1, activation="gelu")


def test_calibration_samples_are_seeded_and_disjoint_windows() -> None:
    tokens = np.arange(1000)
    first, again = calibration_windows(tokens, 10, 20, 0), calibration_windows(tokens, 10, 20, 0)
    other = calibration_windows(tokens, 10, 20, 1)
    assert (first == again).all() and not (first == other).all()
    assert len(set(first.tolist())) == 20 and all(s % 10 == 0 and s + 10 <= 1000 for s in first)
    with pytest.raises(UsageError, match="exceeds the 100 training windows"):
        calibration_windows(tokens, 10, 101, 0)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_an_exported_pruned_model_is_a_plain_checkpoint_that_computes_the_same(
    family: str, tmp_path: Path
) -> None:
    """Pruned to uneven widths, exported padded, read back with AutoModelForCausalLM alone: the
    same logits, the true widths in config.json, and its perplexity recomputed by plain
    cross-entropy equals the one geospec measured."""
    model = hf_models.llama() if family == "llama" else hf_models.gpt2()
    ids = torch.randint(0, hf_models.VOCAB, (3, 17), generator=torch.Generator().manual_seed(0))
    sites = find_ffn_sites(model, hf_models.WIDTH, lambda: logits_of(model, ids[:1, :-1]))
    importance = create_plugin("importance", {"kind": "activation"})
    tokens = np.random.default_rng(0).integers(0, hf_models.VOCAB, 400)
    starts = calibration_windows(tokens, 16, 8, seed=0)
    scores, orders = neuron_scores(model, sites, importance, tokens, starts, 16, 4)
    full = sites[0].ffn.down_proj.in_features if family == "llama" else 4 * hf_models.WIDTH
    widths = [full // 2, full // 4, full // 2 + 8][: len(sites)]
    batches = [(ids[:, :-1], ids[:, 1:])]
    with torch.no_grad(), pruned(sites, orders, widths):
        expected = logits_of(model, ids[:, :-1])
        loss = eval_loss(model, batches)
        kept = ffn_parameters(sites)
        export_pruned(model, sites, widths, tmp_path / "pruned", padded=True)
    assert ffn_parameters(sites) > kept  # put back
    reloaded = hf.AutoModelForCausalLM.from_pretrained(tmp_path / "pruned").eval()
    assert reloaded.config.geospec["ffn_widths"] == widths
    with torch.no_grad():
        got = reloaded(input_ids=ids[:, :-1]).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    plain = F.cross_entropy(got.flatten(0, 1), ids[:, 1:].flatten())
    assert float(plain) == pytest.approx(loss, rel=1e-5)
    # the orderings are the scores' (best first)
    for layer_scores, order in zip(scores, orders, strict=True):
        assert [layer_scores[i] for i in order] == sorted(layer_scores, reverse=True)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_a_compensated_pruned_model_puts_removed_neurons_at_their_calibration_means_and_exports(
    family: str, tmp_path: Path
) -> None:
    """pruned(..., compensation=means) equals the unpruned model whose removed neurons'
    activations a forward hook overwrites with their calibration means; its export (Llama:
    mlp_bias) reloads with AutoModelForCausalLM alone and computes the same logits."""
    model = hf_models.llama() if family == "llama" else hf_models.gpt2()
    with torch.no_grad():  # larger weights: the compensation must change the logits visibly
        for name, parameter in model.named_parameters():
            if "mlp" in name and parameter.dim() == 2:
                parameter.mul_(4)
    ids = torch.randint(0, hf_models.VOCAB, (3, 17), generator=torch.Generator().manual_seed(0))
    sites = find_ffn_sites(model, hf_models.WIDTH, lambda: logits_of(model, ids[:1, :-1]))
    tokens = np.random.default_rng(0).integers(0, hf_models.VOCAB, 400)
    starts = calibration_windows(tokens, 16, 8, seed=0)
    stats = calibration_stats(model, sites, tokens, starts, 16, 4)
    means = [s.mean for s in stats]
    importance = create_plugin("importance", {"kind": "fluctuation"})
    scores, orders = neuron_scores(model, sites, importance, tokens, starts, 16, 4, stats=stats)
    assert (scores, orders) == neuron_scores(model, sites, importance, tokens, starts, 16, 4)
    full = len(orders[0])
    widths = [full // 2, full // 4, full][: len(sites)]  # the last layer is not cut at all
    names = ("down_proj", "c_proj")
    outputs = [next(getattr(s.ffn, n) for n in names if hasattr(s.ffn, n)) for s in sites]

    def overwrite(removed: list[int], mean: torch.Tensor) -> Callable[..., tuple[torch.Tensor]]:
        def hook(module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor]:
            hidden = args[0].clone()
            hidden[..., removed] = mean[removed].to(hidden.dtype)
            return (hidden,)

        return hook

    handles = [
        out.register_forward_pre_hook(overwrite(sorted(order[width:]), mean))
        for out, order, width, mean in zip(outputs, orders, widths, means, strict=True)
    ]
    with torch.no_grad():
        reference = logits_of(model, ids[:, :-1])
    for handle in handles:
        handle.remove()
    with torch.no_grad():
        with pruned(sites, orders, widths):
            uncompensated = logits_of(model, ids[:, :-1])
        with pruned(sites, orders, widths, compensation=means):
            compensated = logits_of(model, ids[:, :-1])
            export_pruned(model, sites, widths, tmp_path / "padded", padded=True)
            export_pruned(model, sites, widths, tmp_path / "true")
    torch.testing.assert_close(compensated, reference, atol=5e-5, rtol=1e-5)
    assert (compensated - uncompensated).abs().max() > 1e-2
    if family == "llama":  # put back: no bias left on the reference
        assert all(s.ffn.down_proj.bias is None for s in sites)
    padded = hf.AutoModelForCausalLM.from_pretrained(tmp_path / "padded").eval()
    true = geospec.load_pruned(tmp_path / "true")  # each layer's FFN at its own width
    for reloaded in (padded, true):
        if family == "llama":
            assert reloaded.config.mlp_bias is True
            mlp = reloaded.model.layers[0].mlp
            assert not mlp.gate_proj.bias.any() and not mlp.up_proj.bias.any()
            assert not reloaded.model.layers[2].mlp.down_proj.bias.any()  # uncut: zero bias
        assert reloaded.config.geospec["ffn_widths"] == widths
        with torch.no_grad():
            got = reloaded(input_ids=ids[:, :-1]).logits
        torch.testing.assert_close(got, compensated, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("family", "full"), [("mistral", 48), ("gemma3_text", 64)])
def test_a_compensated_export_without_an_mlp_bias_keeps_it_at_true_widths_and_refuses_padding(
    tmp_path: Path, family: str, full: int
) -> None:
    """Mistral's and Gemma 3's MLPs have no bias option: the true-width export stores the
    compensation's bias and load_pruned gives it back (the cut model's logits); the padded
    checkpoint, which plain transformers would read without it, is refused in one line and not
    written."""
    model = hf_models.mistral() if family == "mistral" else hf_models.gemma3()
    ids = torch.randint(0, hf_models.VOCAB, (1, 8), generator=torch.Generator().manual_seed(0))
    sites = find_ffn_sites(model, hf_models.WIDTH, lambda: logits_of(model, ids))
    assert compensated_export_problem(hf_models.llama()) is None
    assert compensated_export_problem(hf_models.gpt2()) is None
    problem = compensated_export_problem(model)
    assert problem is not None and f"{family} MLP has no bias" in problem
    orders = [list(range(full))] * len(sites)
    means = [torch.ones(full)] * len(sites)
    widths = [full // 2] * len(sites)
    with torch.no_grad(), pruned(sites, orders, widths, compensation=means):
        expected = logits_of(model, ids)
        with pytest.raises(UsageError, match=rf"padded export.*{family} MLP has no bias"):
            export_pruned(model, sites, widths, tmp_path / "x", padded=True)
        export_pruned(model, sites, widths, tmp_path / "true")
    assert not (tmp_path / "x").exists()
    loaded = geospec.load_pruned(tmp_path / "true")
    assert all(layer.mlp.down_proj.bias is not None for layer in loaded.model.layers)
    with torch.no_grad():
        torch.testing.assert_close(logits_of(loaded, ids), expected, atol=1e-6, rtol=1e-6)


def test_compensate_is_a_prune_option_that_keeps_existing_keys() -> None:
    from geospec.pipeline.keys import section

    table = {"arms": [{"name": "uniform", "schedule": {"kind": "uniform"}}]}
    default = PruneSpec.model_validate(table)
    assert default.compensate == "none"
    assert "compensate" not in section(default)  # run keys from before the option: unchanged
    assert section(PruneSpec.model_validate(table | {"compensate": "none"})) == section(default)
    mean = section(PruneSpec.model_validate(table | {"compensate": "mean"}))
    assert mean["compensate"] == "mean"
    with pytest.raises(ValueError, match="compensate"):
        PruneSpec.model_validate(table | {"compensate": "median"})
    healed = PruneSpec.model_validate(table | {"compensate": "mean", "heal": {"steps": 5}})
    assert healed.compensates(healed.arms[0])  # healing carries the compensation


def test_an_arms_own_importance_and_compensate_keep_existing_keys() -> None:
    from geospec.pipeline.keys import section

    table = {"arms": [{"name": "uniform", "schedule": {"kind": "uniform"}}]}
    assert section(PruneSpec.model_validate(table))["arms"] == table["arms"]  # as before
    own = {"importance": {"kind": "fluctuation"}, "compensate": "mean"}
    spec = PruneSpec.model_validate({"arms": [table["arms"][0] | own]})
    assert section(spec)["arms"][0] == table["arms"][0] | own
    assert spec.importance_of(spec.arms[0]).kind == "fluctuation" and spec.compensates(spec.arms[0])
    default = PruneSpec.model_validate(table)
    assert default.importance_of(default.arms[0]).kind == "activation"
    assert not default.compensates(default.arms[0])
    healed = PruneSpec.model_validate({"arms": [table["arms"][0] | own], "heal": {"steps": 5}})
    assert healed.compensates(healed.arms[0])


def test_a_compensated_cut_imports_with_the_same_logits() -> None:
    """Healing a compensated cut: geospec's engine computes what transformers computes with
    the cut's biases (the means of the removed neurons), and stops when they are put away."""
    from geospec.engine.imported import import_llama, import_problem

    model = hf_models.llama()
    sites = find_ffn_sites(
        model, hf_models.WIDTH, lambda: logits_of(model, torch.zeros(1, 4, dtype=torch.long))
    )
    ids = torch.randint(0, hf_models.VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))
    means = [torch.linspace(-1, 1, 80)] * 3
    with torch.no_grad(), pruned(sites, [list(range(80))] * 3, [40, 80, 24], means):
        assert import_problem(model) is None
        imported = import_llama(model, 16)
        assert imported.config.ffn_out_bias and imported.config.ffn_widths == [40, 80, 24]
        expected = model(input_ids=ids).logits
        got, _ = imported(ids)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert not import_llama(model, 16).config.ffn_out_bias  # the uncut model has none


def word_checkpoint(directory: Path, bos: bool = False) -> Path:
    """A tiny Llama with a word-level tokenizer (with ``bos``, one that starts every text with
    <s>, as Gemma's does), saved as a Hugging Face checkpoint."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {"[UNK]": 0, "</s>": 1} | {f"w{i}": i + 2 for i in range(95)}
    if bos:  # the model has 97 ids: w94 gives its id to <s> (and reads as [UNK])
        vocab = {word: i for word, i in vocab.items() if word != "w94"} | {"<s>": 96}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if bos:
        backend.post_processor = processors.TemplateProcessing(
            single="<s> $A", special_tokens=[("<s>", 96)]
        )
    hf.PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="</s>", unk_token="[UNK]"
    ).save_pretrained(directory)
    hf_models.llama(intermediate_size=64).save_pretrained(directory)
    return directory


def word_corpus(path: Path, seed: int, lines: int = 200) -> Path:
    """Documents of words with a learnable structure: word i is mostly followed by word i + 1."""
    rng = np.random.default_rng(seed)
    documents = []
    for _ in range(lines):
        start = rng.integers(0, 95)
        words = [
            (start + j + int(rng.random() < 0.2) * rng.integers(0, 95)) % 95 for j in range(60)
        ]
        documents.append(json.dumps({"text": " ".join(f"w{w}" for w in words)}))
    path.write_text("\n".join(documents))
    return path


PRUNE_SPEC = {
    "keep": [0.75, 0.5],
    "calibration": {"windows": 8, "seeds": [0, 1, 2]},
    "eval": {"corpora": ["docs.jsonl", "other.jsonl"], "windows": 6},
    "arms": [
        {"name": "uniform", "schedule": {"kind": "uniform"}},
        {"name": "flap", "schedule": {"kind": "flap"}},
        {"name": "owl", "schedule": {"kind": "owl"}},
        {"name": "cosine", "schedule": {"kind": "cosine", "start": 1.2, "end": 0.8}},
        {"name": "shift", "schedule": {"kind": "geometric", "profile": "shift/spherical"}},
    ],
}


def prune_spec(directory: Path, bos: bool = False, **changes: object) -> Path:
    from geospec.testing import minimal_spec

    word_checkpoint(directory / "model", bos)
    word_corpus(directory / "docs.jsonl", 0)
    word_corpus(directory / "other.jsonl", 1, lines=40)
    spec = minimal_spec(
        out=str(directory / "run"),
        model={"n_layers": 3, "d_model": 32, "n_heads": 4, "ffn_width": 64, "seq_len": 16,
               "multiple_of": 8},
        data={"files": ["docs.jsonl"], "tokenizer": {"kind": "pretrained", "path": "model"}},
        reference={"checkpoint": "model"},
        probe={"tokens": 64},
        measure=[{"geometry": "spherical", "statistic": "shift"}],
        prune=PRUNE_SPEC | changes,
        probe_only=True,
    )  # fmt: skip
    path = directory / "spec.toml"
    path.write_text(tomlkit.dumps(spec))
    return path


def invoke(*args: str) -> str:
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code == 0, result.output + repr(result.exception)
    return result.output


@pytest.fixture(scope="module")
def pruned_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("prune")
    output = invoke("prune", str(prune_spec(directory)))
    (directory / "output.txt").write_text(output)
    return directory


def test_each_eval_window_loss_is_recorded_and_bootstrapped(pruned_run: Path) -> None:
    """Every unit records its loss on each eval window (their mean is the corpus loss, all
    windows scoring as many tokens); the report's bootstrap over seeds and windows brackets the
    paired mean, and its Holm-adjusted p is never below the raw p of the same row."""
    from geospec.report.prune import budget_rows
    from geospec.stats import crossed_bootstrap

    record = json.loads((pruned_run / "run" / "prune.json").read_text())
    budget = record["budgets"][1]
    for arm in budget["arms"].values():
        for corpus, seeds in arm["window_loss"].items():
            for seed, windows in seeds.items():
                assert len(windows) == record["windows"]
                assert np.mean(windows) == pytest.approx(arm["loss"][corpus][seed], abs=1e-9)
    rows = {(row[0], row[3]): row for row in budget_rows(record, budget)}
    flap, uniform = budget["arms"]["flap"], budget["arms"]["uniform"]
    table = [
        np.subtract(flap["window_loss"]["docs.jsonl"][s], uniform["window_loss"]["docs.jsonl"][s])
        for s in ("0", "1", "2")
    ]
    found = crossed_bootstrap(table)
    row = rows[("flap", "docs.jsonl")]
    assert row[9] == f"[{found.ci[0]:+.4f}, {found.ci[1]:+.4f}]"
    assert found.ci[0] <= float(row[5]) <= found.ci[1]
    assert float(row[10]) >= found.p
    report = (pruned_run / "run" / "prune" / "report.md").read_text()
    assert "| p (Holm) |" in report


def test_a_window_loss_is_the_loss_of_that_window_alone(pruned_run: Path) -> None:
    from geospec.measure.sensitivity import loss_batches, mean_loss
    from geospec.prune.losses import window_losses

    model = hf.AutoModelForCausalLM.from_pretrained(pruned_run / "model").eval()
    tokens = np.random.default_rng(0).integers(2, 97, 16 * 5 + 1)
    batches = loss_batches(tokens, 16, 5, 2, torch.device("cpu"))
    found = window_losses(model, batches)
    singles = [(x[i : i + 1], y[i : i + 1]) for x, y in batches for i in range(len(x))]
    assert found == pytest.approx([mean_loss(model, [single]) for single in singles], abs=1e-9)


def test_a_units_model_directory_serves_a_transformers_pipeline(pruned_run: Path) -> None:
    """A unit's model/ as it is: load_pruned and the tokenizer beside it make a text-generation
    pipeline whose greedy continuation is the model's own generate."""
    unit = pruned_run / "run" / "prune" / "keep-0.5" / "shift" / "seed-0" / "model"
    model = geospec.load_pruned(unit)
    tokenizer = hf.AutoTokenizer.from_pretrained(unit)
    generate = hf.pipeline("text-generation", model=model, tokenizer=tokenizer)
    found = generate("w1 w2 w3", max_new_tokens=4, do_sample=False, return_tensors=True)
    ids = tokenizer("w1 w2 w3", return_tensors="pt")["input_ids"]
    expected = model.generate(ids, max_new_tokens=4, do_sample=False)
    assert list(found[0]["generated_token_ids"]) == expected[0].tolist()


def test_prune_writes_every_arm_budget_and_seed(pruned_run: Path) -> None:
    record = json.loads((pruned_run / "run" / "prune.json").read_text())
    assert [b["keep"] for b in record["budgets"]] == [0.75, 0.5]
    for budget in record["budgets"]:
        assert set(budget["arms"]) == {"uniform", "flap", "owl", "cosine", "shift"}
        params = {p for arm in budget["arms"].values() for p in arm["ffn_params"].values()}
        assert len(params) == 1  # exactly equal FFN parameters (a budget of whole multiples)
        for arm in budget["arms"].values():
            for widths in arm["widths"].values():
                assert sum(widths) == budget["budget"] and max(widths) <= 64
            assert set(arm["loss"]) == {"docs.jsonl", "other.jsonl"}
            assert set(arm["loss"]["docs.jsonl"]) == {"0", "1", "2"}
    uniform = record["budgets"][1]["arms"]["uniform"]["loss"]["docs.jsonl"]
    assert all(v != record["reference"]["docs.jsonl"] for v in uniform.values())  # a random
    # model's loss can go either way when it loses neurons; only that it changed is certain
    output = (pruned_run / "output.txt").read_text()
    assert "## Pruning the reference" in output and "pruned models: 30/30" in output
    report = (pruned_run / "run" / "prune" / "report.md").read_text()
    assert "Every arm has the same FFN parameters." in report and "| flap |" in report


def plain_loss(directory: Path, model_dir: Path) -> float:
    """Plain transformers on the exported model (read at its true widths by geospec.load_pruned:
    a LlamaForCausalLM) and plain cross-entropy on the first 6 validation windows of
    docs.jsonl (geospec's data pipeline gives the tokens)."""
    import geospec
    from geospec.engine.batches import validation_windows, window_tensors
    from geospec.engine.token_data import prepare_data
    from geospec.spec.loading import load_spec

    model = geospec.load_pruned(model_dir)
    spec = load_spec(directory / "spec.toml")
    data = prepare_data(spec.data, directory / "cache", spec_dir=directory)
    tokens = data.val[:-1] if int(data.val[-1]) == data.eot_id else data.val
    x, y = window_tensors(tokens, validation_windows(len(tokens), 16, 6 * 16), 16)
    with torch.no_grad():
        logits = model(input_ids=x).logits
    return float(F.cross_entropy(logits.flatten(0, 1).float(), y.flatten()))


def test_a_pruned_checkpoint_loads_with_plain_transformers_to_the_recorded_loss(
    pruned_run: Path,
) -> None:
    """The exported owl model (true widths) read by geospec.load_pruned is a plain
    LlamaForCausalLM at its widths, and it scores the loss geospec recorded."""
    import geospec

    record = json.loads((pruned_run / "run" / "prune.json").read_text())
    unit = pruned_run / "run" / "prune" / "keep-0.5" / "owl" / "seed-1"
    model = geospec.load_pruned(unit / "model")
    widths = record["budgets"][1]["arms"]["owl"]["widths"]["1"]
    assert type(model) is hf.LlamaForCausalLM and model.config.geospec["ffn_widths"] == widths
    assert [layer.mlp.down_proj.in_features for layer in model.model.layers] == widths
    recorded = record["budgets"][1]["arms"]["owl"]["loss"]["docs.jsonl"]["1"]
    assert plain_loss(pruned_run, unit / "model") == pytest.approx(recorded, rel=1e-5)


def test_a_compensated_prune_exports_the_model_it_scored(tmp_path: Path) -> None:
    """compensate = "mean" through the prune stage: the exported checkpoint (mlp_bias) scores
    the loss the stage recorded under plain transformers, and compensating changed the model
    (the recorded loss differs from the same unit without compensation)."""
    arms = [{"name": "uniform", "schedule": {"kind": "uniform"}}]
    settings = {"keep": 0.5, "calibration": {"windows": 8, "seeds": [0]}, "arms": arms}
    losses = {}
    for compensate in ("none", "mean"):
        directory = tmp_path / compensate
        directory.mkdir()
        invoke("prune", str(prune_spec(directory, compensate=compensate, **settings)))
        record = json.loads((directory / "run" / "prune.json").read_text())
        losses[compensate] = record["budgets"][0]["arms"]["uniform"]["loss"]["docs.jsonl"]["0"]
        unit = directory / "run" / "prune" / "keep-0.5" / "uniform" / "seed-0" / "model"
        assert plain_loss(directory, unit) == pytest.approx(losses[compensate], rel=1e-5)
    assert losses["mean"] != losses["none"]


def test_geospec_export_writes_a_prune_unit_or_says_why_not(
    pruned_run: Path, tmp_path: Path
) -> None:
    """geospec export on a prune unit (it used to say "no readable result.json"): --format hf
    copies the unit's checkpoint; GGUF needs a BPE tokenizer (this run's is word-level: one
    line); a unit pruned without export is one line naming the setting."""
    import shutil

    import geospec

    unit = pruned_run / "run" / "prune" / "keep-0.5" / "owl" / "seed-1"
    result = CliRunner().invoke(cli, ["export", str(unit), "--to", str(tmp_path / "owl")])
    assert result.exit_code == 0, result.output
    widths = json.loads((unit / "result.json").read_text())["widths"]
    assert f"widths {' '.join(map(str, widths))}" in result.output
    ids = torch.tensor([[3, 4, 5, 6, 7]])
    with torch.no_grad():
        copied = geospec.load_pruned(tmp_path / "owl")(ids).logits
        torch.testing.assert_close(copied, geospec.load_pruned(unit / "model")(ids).logits)
    # --padded: a directory plain transformers reads (one intermediate_size), computing the
    # true-width model's logits, the true widths recorded, the tokenizer beside it
    padded = tmp_path / "owl-padded"
    result = CliRunner().invoke(cli, ["export", str(unit), "--to", str(padded), "--padded"])
    assert result.exit_code == 0, result.output
    assert f"padded to {max(widths)}" in result.output and "with its tokenizer" in result.output
    plain = hf.AutoModelForCausalLM.from_pretrained(padded).eval()
    assert {layer.mlp.down_proj.in_features for layer in plain.model.layers} == {max(widths)}
    assert json.loads((padded / "config.json").read_text())["geospec"]["ffn_widths"] == widths
    assert hf.AutoTokenizer.from_pretrained(padded)("a b")["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(plain(ids).logits, copied, atol=1e-5, rtol=1e-5)
    gguf_padded = ["export", str(unit), "--to", str(tmp_path / "p.gguf"), "--format", "gguf"]
    refused = CliRunner().invoke(cli, [*gguf_padded, "--padded"])
    assert refused.exit_code == 2 and "--padded" in refused.output
    if importlib.util.find_spec("gguf") is not None:
        out = tmp_path / "owl.gguf"
        words = CliRunner().invoke(cli, ["export", str(unit), "--to", str(out), "--format", "gguf"])
        assert words.exit_code == 2 and "not a byte-level BPE" in words.output
        assert len(words.output.strip().splitlines()) == 1 and not out.exists()
    bare = tmp_path / "run" / "prune" / "keep-0.5" / "owl" / "seed-1"
    shutil.copytree(unit, bare, ignore=shutil.ignore_patterns("model"))
    missing = CliRunner().invoke(cli, ["export", str(bare), "--to", str(tmp_path / "none")])
    assert missing.exit_code == 2 and "export = true" in missing.output
    assert "no readable" not in missing.output and not (tmp_path / "none").exists()
    # an arm the prune does not have is no unfinished unit: the units it has are named
    other = unit.parents[1] / "greedy" / "seed-1"
    absent = CliRunner().invoke(cli, ["export", str(other), "--to", str(tmp_path / "none")])
    assert absent.exit_code == 2 and "no such prune unit" in absent.output
    assert "0.5/owl/1" not in absent.output and "0.5/owl/seed-1" in absent.output
    assert "run geospec prune again" not in absent.output


def test_an_arms_own_importance_and_compensate_prune_as_the_prunes_would(tmp_path: Path) -> None:
    """FLAP as its paper runs it set on the arm (fluctuation scores, compensate = "mean") under
    a prune whose own settings are the defaults, beside the same arms in a prune that sets
    fluctuation and "mean" for every arm: the same widths and the same losses; the prune's
    default arm next to them is neither compensated nor scored alike."""
    faithful = {"importance": {"kind": "fluctuation"}, "compensate": "mean"}
    base = {"keep": 0.5, "calibration": {"windows": 8, "seeds": [0]}}
    runs = {
        "prune": [
            {"name": "uniform", "schedule": {"kind": "uniform"}},
            {"name": "flap", "schedule": {"kind": "flap"}},
        ],
        "arm": [
            {"name": "uniform", "schedule": {"kind": "uniform"}},
            {"name": "uniform-wifv", "schedule": {"kind": "uniform"}, **faithful},
            {"name": "flap", "schedule": {"kind": "flap"}, **faithful},
        ],
    }
    records = {}
    for name, arm_tables in runs.items():
        directory = tmp_path / name
        directory.mkdir()
        settings = base | (faithful if name == "prune" else {})
        invoke("prune", str(prune_spec(directory, arms=arm_tables, **settings)))
        record = json.loads((directory / "run" / "prune.json").read_text())
        records[name] = record["budgets"][0]["arms"]
    by_prune, by_arm = records["prune"], records["arm"]

    def losses(arms: dict[str, Any], arm: str) -> list[float]:
        return [arms[arm]["loss"][corpus]["0"] for corpus in ("docs.jsonl", "other.jsonl")]

    assert by_arm["flap"]["widths"] == by_prune["flap"]["widths"]
    assert losses(by_arm, "flap") == pytest.approx(losses(by_prune, "flap"), rel=1e-6)
    wifv = losses(by_arm, "uniform-wifv")
    assert wifv == pytest.approx(losses(by_prune, "uniform"), rel=1e-6)
    assert all(a != b for a, b in zip(losses(by_arm, "uniform"), wifv, strict=True))
    unit = tmp_path / "arm" / "run" / "prune" / "keep-0.5"
    assert json.loads((unit / "uniform-wifv" / "seed-0" / "model" / "config.json").read_text())[
        "mlp_bias"
    ]
    assert not json.loads((unit / "uniform" / "seed-0" / "model" / "config.json").read_text())[
        "mlp_bias"
    ]


def test_a_greedy_arm_searches_on_the_calibration_text(tmp_path: Path) -> None:
    """The search through the prune stage: its widths keep the budget in multiples, and they
    are what the same search finds on the same calibration windows, which are training text:
    the eval corpora changed, the widths stay."""
    arms = [
        {"name": "uniform", "schedule": {"kind": "uniform"}},
        {"name": "greedy", "schedule": {"kind": "greedy", "step": 2}},
    ]
    settings = {"keep": 0.5, "calibration": {"windows": 4, "seeds": [0]}, "arms": arms}
    found = []
    for name, corpora in (("a", ["docs.jsonl"]), ("b", ["other.jsonl"])):
        directory = tmp_path / name
        directory.mkdir()
        spec = prune_spec(directory, eval={"corpora": corpora, "windows": 4}, **settings)
        invoke("prune", str(spec))
        record = json.loads((directory / "run" / "prune.json").read_text())
        widths = record["budgets"][0]["arms"]["greedy"]["widths"]["0"]
        assert sum(widths) == record["budgets"][0]["budget"] == 96
        assert all(w % 8 == 0 and 8 <= w <= 64 for w in widths)
        found.append(widths)
    assert found[0] == found[1]


def test_an_owl_grid_reports_its_best_setting_by_calibration_loss(tmp_path: Path) -> None:
    """A lam x m grid expands into one arm per setting, each scored on the calibration windows
    (training text) as well as on the eval corpora; the best by mean calibration loss is
    reported, and other eval corpora change neither it nor any calibration loss."""
    arms = [
        {"name": "uniform", "schedule": {"kind": "uniform"}},
        {"name": "owl", "schedule": {"kind": "owl"}, "grid": {"lam": [0.02, 0.2], "m": [1.5, 3]}},
    ]
    settings = {"keep": 0.5, "calibration": {"windows": 4, "seeds": [0, 1]}, "arms": arms}
    sweeps = []
    for name, corpora in (("a", ["docs.jsonl"]), ("b", ["other.jsonl"])):
        directory = tmp_path / name
        directory.mkdir()
        spec = prune_spec(directory, eval={"corpora": corpora, "windows": 4}, **settings)
        output = invoke("prune", str(spec))
        budget = json.loads((directory / "run" / "prune.json").read_text())["budgets"][0]
        grid = ["owl-lam0.02-m1.5", "owl-lam0.02-m3", "owl-lam0.2-m1.5", "owl-lam0.2-m3"]
        assert set(budget["arms"]) == {"uniform", *grid}
        means = {arm: sum(budget["arms"][arm]["calibration_loss"].values()) / 2 for arm in grid}
        found = budget["sweeps"]["owl"]
        assert found["best"] == min(grid, key=lambda arm: means[arm])
        assert found["calibration_loss"] == pytest.approx(means)
        assert f"the best of the 'owl' grid on the calibration windows is {found['best']!r}" in (
            " ".join(output.split())
        )
        assert "calibration_loss" not in budget["arms"]["uniform"]
        sweeps.append(found)
    assert sweeps[0] == sweeps[1]


def test_a_rerun_reuses_every_pruned_model(pruned_run: Path) -> None:
    output = invoke("prune", str(pruned_run / "spec.toml"))
    assert "prune: up to date" in output and "pruned models" not in output


def test_a_taper_that_would_grow_a_layer_is_one_line(tmp_path: Path) -> None:
    arms = [
        *PRUNE_SPEC["arms"][:1],
        {"name": "steep", "schedule": {"kind": "cosine", "start": 1.8, "end": 0.2}},
    ]  # type: ignore[misc]
    spec = prune_spec(tmp_path, arms=arms, keep=0.75)
    result = CliRunner().invoke(cli, ["prune", str(spec)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    last = result.output.strip().splitlines()[-1]
    assert "prune arm 'steep'" in last and "beyond its pretrained width 64" in last
    assert not (tmp_path / "run" / "prune.json").exists()


def test_an_interrupted_prune_recomputes_only_the_missing_units(pruned_run: Path) -> None:
    """prune.json and one unit's record lost (a kill between units): the rerun keeps the 29
    others (their exported models untouched) and ends with the same prune.json."""
    run = pruned_run / "run"
    before = json.loads((run / "prune.json").read_text())
    kept = run / "prune" / "keep-0.75" / "flap" / "seed-2" / "model" / "model.safetensors"
    stamp = kept.stat().st_mtime_ns
    (run / "prune.json").unlink()
    (run / "prune" / "keep-0.5" / "shift" / "seed-0" / "result.json").unlink()
    invoke("prune", str(pruned_run / "spec.toml"))
    after = json.loads((run / "prune.json").read_text())
    assert after == before and kept.stat().st_mtime_ns == stamp


@pytest.mark.parametrize("damaged", ["prune.json", "unit"])
def test_an_edited_prune_record_is_recomputed(pruned_run: Path, damaged: str) -> None:
    """A loss edited behind geospec's back (its key intact) breaks the seal: the rerun
    recomputes what it must and ends with the record an undamaged run has."""
    run = pruned_run / "run"
    before = json.loads((run / "prune.json").read_text())
    path = run / "prune.json"
    if damaged == "unit":
        path = run / "prune" / "keep-0.75" / "owl" / "seed-0" / "result.json"
    data = json.loads(path.read_text())
    if damaged == "unit":
        data["loss"]["docs.jsonl"] -= 0.5
        (run / "prune.json").unlink()  # so that the stage runs and meets the unit
    else:
        data["budgets"][0]["arms"]["owl"]["loss"]["docs.jsonl"]["0"] -= 0.5
    path.write_text(json.dumps(data))
    output = invoke("prune", str(pruned_run / "spec.toml"))
    if damaged == "prune.json":
        assert "! prune: prune.json was changed after geospec wrote it" in output
    assert json.loads((run / "prune.json").read_text()) == before


def test_healing_fine_tunes_each_pruned_model_from_its_own_weights(tmp_path: Path) -> None:
    """heal.steps: each pruned model, imported into geospec's engine with its uneven widths, is
    trained on [data]'s text; at a vanishing learning rate the healed loss is the pruned loss
    (the import is exact and training starts from the pruned weights), at a real one it moves."""
    arms = PRUNE_SPEC["arms"][:2]  # uniform and flap
    spec = prune_spec(
        tmp_path,
        arms=arms,
        keep=0.5,
        calibration={"windows": 8, "seeds": [0]},
        export=False,
        heal={"steps": 2, "lr": 1e-12, "batch_size": 2},
    )
    invoke("prune", str(spec))
    record = json.loads((tmp_path / "run" / "prune.json").read_text())
    for name in ("uniform", "flap"):
        arm = record["budgets"][0]["arms"][name]
        for corpus in ("docs.jsonl", "other.jsonl"):
            assert arm["healed_loss"][corpus]["0"] == pytest.approx(
                arm["loss"][corpus]["0"], abs=1e-5
            )
    heal_dir = tmp_path / "run" / "prune" / "keep-0.5" / "flap" / "seed-0" / "heal"
    config = json.loads((heal_dir / "config.json").read_text())
    assert config["ffn_widths"] == record["budgets"][0]["arms"]["flap"]["widths"]["0"]
    assert config["norm_eps"] == pytest.approx(1e-6)  # the checkpoint's own epsilon
    # a real learning rate: the loss moves
    spec.write_text(spec.read_text().replace("lr = 1e-12", "lr = 0.01"))
    invoke("prune", str(spec))
    healed = json.loads((tmp_path / "run" / "prune.json").read_text())["budgets"][0]["arms"]
    moved = healed["uniform"]["healed_loss"]["docs.jsonl"]["0"]
    assert abs(moved - healed["uniform"]["loss"]["docs.jsonl"]["0"]) > 1e-3
    assert "| docs.jsonl, healed |" in (tmp_path / "run" / "prune" / "report.md").read_text()


def test_a_healed_unit_exports_its_healed_model_with_the_compensation(tmp_path: Path) -> None:
    """heal.steps with compensate = "mean" and export: the unit's model/ is the healed model,
    compensation biases included, whether it is exported as the unit finishes or asked for
    afterwards: read back by load_pruned (plain transformers), it computes the logits of the
    engine's healed model and the healed loss recorded for the unit."""
    from geospec.engine.checkpoint import load_model

    arm = {"name": "flap", "schedule": {"kind": "flap"}, "compensate": "mean"}
    heal = {"steps": 3, "lr": 0.01, "batch_size": 2}
    unit = tmp_path / "run" / "prune" / "keep-0.5" / "flap" / "seed-0"
    spec = prune_spec(
        tmp_path, arms=[PRUNE_SPEC["arms"][0], arm], keep=0.5,
        calibration={"windows": 8, "seeds": [0]},
        export=False, heal=heal,
    )  # fmt: skip
    ids = torch.randint(0, 40, (2, 16), generator=torch.Generator().manual_seed(0))
    for export, when in ((False, "never"), (True, "afterwards"), (True, "as it finishes")):
        if when == "as it finishes":
            shutil.rmtree(tmp_path / "run")
        spec.write_text(spec.read_text().replace(f"export = {str(not export).lower()}",
                                                 f"export = {str(export).lower()}"))  # fmt: skip
        invoke("prune", str(spec))
        if not export:
            assert not (unit / "model").exists()
            continue
        healed = load_model(unit / "heal")
        assert healed.config.ffn_out_bias
        exported = geospec.load_pruned(unit / "model").eval()
        assert exported.config.mlp_bias, when
        with torch.no_grad():
            expected, _ = healed(ids)
            got = exported(input_ids=ids).logits
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
        record = json.loads((tmp_path / "run" / "prune.json").read_text())
        flap = record["budgets"][0]["arms"]["flap"]
        assert flap["healed_loss"]["docs.jsonl"]["0"] != flap["loss"]["docs.jsonl"]["0"]
        # the checkpoint's tokenizer beside it: AutoTokenizer reads the export as it is
        text = json.loads((tmp_path / "other.jsonl").read_text().splitlines()[0])["text"]
        own = hf.AutoTokenizer.from_pretrained(tmp_path / "model")(text)["input_ids"]
        assert hf.AutoTokenizer.from_pretrained(unit / "model")(text)["input_ids"] == own


def test_exports_are_written_in_the_checkpoints_dtype_or_the_one_named(tmp_path: Path) -> None:
    """A bf16 checkpoint's pruned models are bf16 (half a float32 export's size) although they
    are computed in reference.dtype (float32); export_dtype names another, and changing it
    writes the models again without computing any unit again (the stage keeps its key)."""
    from safetensors import safe_open

    spec = prune_spec(tmp_path, arms=PRUNE_SPEC["arms"][:2], keep=0.5,
                      calibration={"windows": 8, "seeds": [0]})  # fmt: skip
    checkpoint = tmp_path / "model"
    hf.AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.bfloat16).save_pretrained(
        checkpoint
    )
    assert json.loads((checkpoint / "config.json").read_text())["dtype"] == "bfloat16"
    unit = tmp_path / "run" / "prune" / "keep-0.5" / "flap" / "seed-0"

    def stored() -> set[torch.dtype]:
        with safe_open(str(unit / "model" / "model.safetensors"), "pt") as file:
            return {file.get_tensor(name).dtype for name in file.keys()}  # noqa: SIM118

    invoke("prune", str(spec))
    assert stored() == {torch.bfloat16}
    assert json.loads((unit / "model" / "config.json").read_text())["dtype"] == "bfloat16"
    ids = torch.randint(0, 40, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        half = geospec.load_pruned(unit / "model", dtype=torch.float32)(input_ids=ids).logits
    record = (unit / "result.json").read_bytes()
    key = json.loads((tmp_path / "run" / "prune.json").read_text())["key"]
    data = tomlkit.parse(spec.read_text())
    data["prune"]["export_dtype"] = "float32"
    spec.write_text(tomlkit.dumps(data))
    invoke("prune", str(spec))
    assert stored() == {torch.float32}
    assert (unit / "result.json").read_bytes() == record  # written again, not computed again
    assert json.loads((tmp_path / "run" / "prune.json").read_text())["key"] == key
    with torch.no_grad():  # the same pruned model, its weights rounded to bf16 or not
        full = geospec.load_pruned(unit / "model")(input_ids=ids).logits
    torch.testing.assert_close(half, full, atol=0.05, rtol=0.05)


def test_healing_can_distil_from_the_unpruned_model(tmp_path: Path) -> None:
    """heal.distill = 1: each pruned model is trained on the KL divergence from the unpruned
    reference, imported into the engine (its heal run's fingerprint names the teacher's
    weights); at a vanishing learning rate the healed loss is the pruned loss, and a new
    distill share is a new healing (tests/test_distill.py: the student moves to its teacher).
    Healing says what it heals and shows its progress: step, loss, tokens/s, eta."""
    from geospec.engine.identity import weights_digest
    from geospec.engine.imported import import_llama

    heal = {"steps": 4, "lr": 1e-12, "batch_size": 4, "distill": 1.0}
    spec = prune_spec(
        tmp_path, arms=PRUNE_SPEC["arms"][:1], keep=0.5, export=False,
        calibration={"windows": 8, "seeds": [0]}, heal=heal,
    )  # fmt: skip
    heal_dir = tmp_path / "run" / "prune" / "keep-0.5" / "uniform" / "seed-0" / "heal"
    output = invoke("prune", str(spec))
    # what healing shows (in a log: a line per log interval, here every step of 4)
    said = "heal: uniform@0.5 (seed 0), 4 steps of 4 x 16 tokens, distilled from the unpruned"
    assert said in output
    steps = [line for line in output.splitlines() if re.match(r"step \d+/", line)]
    assert [line.split()[1] for line in steps] == ["1/4", "2/4", "3/4", "4/4"], output
    assert all("loss" in line and "tok/s" in line and "eta" in line for line in steps)
    reference = hf.AutoModelForCausalLM.from_pretrained(tmp_path / "model").eval()
    teacher = import_llama(reference, 16)
    result = json.loads((heal_dir / "result.json").read_text())
    assert result["fingerprint"]["teacher"] == {
        "weights": weights_digest(teacher.state_dict()), "weight": 1.0, "temperature": 1.0
    }  # fmt: skip
    arm = json.loads((tmp_path / "run" / "prune.json").read_text())["budgets"][0]["arms"]
    for corpus in ("docs.jsonl", "other.jsonl"):
        loss = arm["uniform"]["loss"][corpus]["0"]
        assert arm["uniform"]["healed_loss"][corpus]["0"] == pytest.approx(loss, abs=1e-5)
    spec.write_text(spec.read_text().replace("distill = 1.0", "distill = 0.5"))
    invoke("prune", str(spec))
    result = json.loads((heal_dir / "result.json").read_text())
    assert result["fingerprint"]["teacher"]["weight"] == 0.5


def test_healing_takes_the_units_bar_off_a_terminal_while_its_own_shows() -> None:
    """A terminal shows one live display at a time: the prune's bar of units is stopped while a
    unit heals (its training bar shows) and shown again after (prune.study.shown_alone)."""
    from io import StringIO

    from rich.console import Console

    from geospec.engine.progress import stage_progress

    console = Console(file=StringIO(), force_terminal=True)
    with stage_progress(console, print, "pruned models", 2) as advance:
        assert advance.bar.live.is_started
        with advance.paused():
            assert not advance.bar.live.is_started
        assert advance.bar.live.is_started
        advance(2)
    assert "pruned models" in console.file.getvalue()  # type: ignore[attr-defined]


def test_healing_a_model_geospec_cannot_import_is_one_line(tmp_path: Path) -> None:
    spec = prune_spec(tmp_path, heal={"steps": 2}, arms=PRUNE_SPEC["arms"][:1], keep=0.5)
    hf_models.gpt2().save_pretrained(tmp_path / "model")  # replaces the Llama weights
    # [model] as a user of this GPT-2 would leave it: the shape is read from its config.json
    data = tomlkit.parse(spec.read_text())
    data["model"] = {"seq_len": 16, "multiple_of": 8}
    spec.write_text(tomlkit.dumps(data))
    result = CliRunner().invoke(cli, ["prune", str(spec)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    last = result.output.strip().splitlines()[-1]
    assert "prune.heal:" in last and "not Llama-family" in last
    assert not (tmp_path / "run" / "prune.json").exists()


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        ({"keep": 1.5}, "prune.keep", "less than or equal to 1"),
        ({"keep": [0.5, 0.0]}, "prune.keep", "greater than 0"),
        ({"baseline": "nope"}, "prune", "baseline 'nope' is not one of the arms"),
        ({"calibration": {"seeds": [1, 1]}}, "prune.calibration.seeds", "distinct"),
        ({"heal": {"steps": -1}}, "prune.heal.steps", "greater than or equal to 0"),
        (
            {"arms": [{"name": "uniform", "schedule": "uniform", "grid": {}}]},
            "prune",
            "arms[0].grid is empty",
        ),
        (
            {"arms": [PRUNE_SPEC["arms"][0], {"name": "o", "schedule": "owl", "grid": {"m": []}}]},
            "prune",
            "arms[1].grid.m is empty",
        ),
    ],
)
def test_bad_prune_settings_name_the_field(
    change: dict[str, object], field: str, message: str
) -> None:
    from geospec.errors import SpecError
    from geospec.spec.loading import validate_spec
    from geospec.testing import minimal_spec

    spec = minimal_spec(
        probe_only=True,
        reference={"checkpoint": "model"},
        data={"tokenizer": {"kind": "pretrained", "path": "model"}},
        prune=PRUNE_SPEC | change,
        measure=[{"geometry": "spherical", "statistic": "shift"}],
    )
    with pytest.raises(SpecError) as error:
        validate_spec(spec)
    assert field in str(error.value) and message in str(error.value)


def test_a_prune_without_a_checkpoint_or_with_a_short_eval_corpus_is_one_line(
    tmp_path: Path,
) -> None:
    from geospec.errors import SpecError
    from geospec.spec.loading import validate_spec
    from geospec.testing import minimal_spec

    with pytest.raises(SpecError, match=r"prunes a pretrained reference\.checkpoint"):
        validate_spec(minimal_spec(prune={"arms": PRUNE_SPEC["arms"][:1]}))
    spec = prune_spec(tmp_path, arms=PRUNE_SPEC["arms"][:1], keep=0.5)
    (tmp_path / "other.jsonl").write_text(json.dumps({"text": "w1 w2 w3"}))
    result = CliRunner().invoke(cli, ["prune", str(spec)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    last = result.output.strip().splitlines()[-1]
    assert "prune.eval.corpora: 'other.jsonl'" in last and "val split is empty" in last
    # long enough to split, too short for the windows asked
    (tmp_path / "other.jsonl").write_text(
        "\n".join(json.dumps({"text": f"w{i} w{i + 1} w{i + 2}"}) for i in range(40))
    )
    result = CliRunner().invoke(cli, ["prune", str(spec)])
    last = result.output.strip().splitlines()[-1]
    assert result.exit_code == 2 and "fewer than 6 windows of 16 need" in last


def test_the_report_has_the_pruning_section_and_its_plot(pruned_run: Path) -> None:
    invoke("report", str(pruned_run / "run"))
    report = (pruned_run / "run" / "report.md").read_text()
    assert "## Pruning the reference" in report and "![prune](plots/prune.png)" in report
    assert (pruned_run / "run" / "plots" / "prune.png").stat().st_size > 1000


def test_a_prune_spec_needs_no_arms_no_train_and_no_tokenizer(tmp_path: Path) -> None:
    """The quick start's shape: a checkpoint, [model] seq_len and [prune]. The tokenizer is the
    checkpoint's own (the same tokens as naming it: the same data key), nothing is trained,
    and the pruned model is written and loads with plain transformers."""
    from geospec.pipeline.keys import data_key
    from geospec.spec.loading import load_spec

    word_checkpoint(tmp_path / "model")
    word_corpus(tmp_path / "docs.jsonl", 0)
    spec_path = tmp_path / "spec.toml"
    spec_path.write_text(
        f'name = "quick"\nout = "{tmp_path / "run"}"\n\n'
        '[model]\nseq_len = 16\nmultiple_of = 8\n\n[data]\nfiles = ["docs.jsonl"]\n\n'
        '[reference]\ncheckpoint = "model"\n\n[probe]\ntokens = 64\n\n'
        '[prune]\nkeep = 0.5\neval = { corpora = ["docs.jsonl"], windows = 4 }\n'
        "calibration = { windows = 4 }\n\n"
        '[[prune.arms]]\nname = "uniform"\nschedule = { kind = "uniform" }\n\n'
        '[[prune.arms]]\nname = "flap"\nschedule = { kind = "flap" }\n'
    )
    spec = load_spec(spec_path)
    named = load_spec(
        spec_path,
        ['data.tokenizer={ kind = "pretrained", path = "model" }'],
    )
    assert data_key(spec.data) == data_key(named.data)
    assert spec.probe_only and spec.arms == []
    result = CliRunner().invoke(cli, ["prune", str(spec_path)])
    assert result.exit_code == 0, result.output
    # what each stage does on stderr, without transformers' bars; the comparison on stdout
    assert "pruned models: 2/2" in result.stderr and "✓ reference:" in result.stderr
    assert "Loading weights" not in result.output and "it/s" not in result.output
    assert "| flap |" in result.stdout and "✓ reference:" not in result.stdout
    model = hf.AutoModelForCausalLM.from_pretrained(
        tmp_path / "run" / "prune" / "keep-0.5" / "flap" / "seed-0" / "model"
    )
    assert sum(model.config.geospec["ffn_widths"]) == 3 * 32
    assert not (tmp_path / "run" / "arms").exists()  # nothing trained
    # and nothing is reported as to be trained: not by status, the report or a dry run
    ran = CliRunner().invoke(cli, ["run", str(spec_path)])
    assert ran.exit_code == 0, ran.output
    assert "✓ prune" in ran.stderr and "report:" in ran.stderr and "✓" not in ran.stdout
    found = json.loads(invoke("status", str(tmp_path / "run"), "--json"))
    assert found["trains"] is False and found["runs"] == [] and not any(found["counts"].values())
    assert {s["name"]: s["state"] for s in found["stages"]}["train"] == "skipped"
    assert "runs: none" in invoke("status", str(tmp_path / "run"))
    report = (tmp_path / "run" / "report.md").read_text()
    assert "No arm is trained" in report and "## Pruning the reference" in report
    assert "planned runs" not in report and "val loss" not in report
    assert json.loads((tmp_path / "run" / "results.json").read_text())["probe_only"] is True
    rehearsal = json.loads(invoke("rehearse", str(spec_path), "--json"))
    assert rehearsal == {"arms": [], "gpu_hours": 0.0, "trains": False}
    assert "0 GPU-hours" in invoke("run", str(spec_path), "--dry-run")


def test_a_probe_only_run_with_arms_reports_no_pending_runs(pruned_run: Path) -> None:
    """The probe-only spec of the module's prune lists arms (their widths are solved): status
    counts no run as pending and the report has no partial-run note nor untrained rows; a run
    directory from before run.json said probe_only is recognised by its train stage's key."""
    from geospec.rundir.records import PROBE_ONLY_TRAIN_KEY

    run_dir = pruned_run / "run"
    invoke("run", str(pruned_run / "spec.toml"))
    assert json.loads((run_dir / "stages.json").read_text())["train"] == PROBE_ONLY_TRAIN_KEY
    record = json.loads((run_dir / "run.json").read_text())
    assert record["probe_only"] is True and record["arms"]
    report = (run_dir / "report.md").read_text()
    assert "planned runs" not in report and "(not trained)" not in report
    assert "## FFN widths per arm" in report
    record.pop("probe_only")  # as an earlier geospec wrote it
    (run_dir / "run.json").write_text(json.dumps(record))
    found = json.loads(invoke("status", str(run_dir), "--json"))
    assert found["trains"] is False and found["counts"]["pending"] == 0
    invoke("report", str(run_dir))
    assert "planned runs" not in (run_dir / "report.md").read_text()


def test_the_stages_share_one_loaded_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probe and the prune read the same pretrained reference: it is loaded once per
    process (a GGUF is de-quantised once), and a later pipeline loads it afresh."""
    import geospec.engine.pretrained as pretrained

    real = pretrained.load_pretrained
    loads: list[str] = []

    def counted(*args: object, **kwargs: object) -> object:
        loads.append(str(args[0]))
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(pretrained, "load_pretrained", counted)
    arms = [
        {"name": "uniform", "schedule": {"kind": "uniform"}},
        {"name": "shift", "schedule": {"kind": "geometric", "profile": "shift/spherical"}},
    ]
    settings = {"keep": 0.5, "calibration": {"windows": 4, "seeds": [0]}, "arms": arms}
    spec = prune_spec(tmp_path, export=False, **settings)
    invoke("prune", str(spec))
    assert len(loads) == 1  # probed, then pruned: one load
    invoke("prune", str(spec), "--from", "prune")
    assert len(loads) == 2


def test_a_tokenizer_with_a_bos_starts_every_scored_window_with_it(tmp_path: Path) -> None:
    """A checkpoint whose tokenizer starts every text with <s> (as Gemma's does) is scored
    as it reads text: plain transformers on the exported model, each window of docs.jsonl's
    validation split read after <s> and scoring its own 16 tokens, gives the recorded loss."""
    from geospec.engine.token_data import prepare_data
    from geospec.spec.loading import load_spec

    arms = [{"name": "uniform", "schedule": {"kind": "uniform"}}]
    settings = {"keep": 0.5, "calibration": {"windows": 4, "seeds": [0]}, "arms": arms}
    invoke("prune", str(prune_spec(tmp_path, bos=True, **settings)))
    record = json.loads((tmp_path / "run" / "prune.json").read_text())
    recorded = record["budgets"][0]["arms"]["uniform"]["loss"]["docs.jsonl"]["0"]
    data = prepare_data(
        load_spec(tmp_path / "spec.toml").data, tmp_path / "cache", spec_dir=tmp_path
    )
    tokens = np.asarray(data.val[:-1] if int(data.val[-1]) == data.eot_id else data.val)
    windows = tokens[: 6 * 16].astype(np.int64).reshape(6, 16)
    x = torch.as_tensor(np.concatenate([np.full((6, 1), 96), windows[:, :-1]], axis=1))
    from geospec.prune.true_width import load_pruned

    model = load_pruned(tmp_path / "run" / "prune" / "keep-0.5" / "uniform" / "seed-0" / "model")
    with torch.no_grad():
        logits = model(input_ids=x).logits
    loss = float(F.cross_entropy(logits.flatten(0, 1).float(), torch.as_tensor(windows).flatten()))
    assert loss == pytest.approx(recorded, rel=1e-5)


def test_report_compare_may_pair_prune_arms(pruned_run: Path, tmp_path: Path) -> None:
    """report.compare names arms of [prune] too: each budget gets a table of those pairs,
    Holm-adjusted across them; a name that is no arm is refused naming the prune's arms."""
    from geospec.report.prune import prune_markdown

    record = json.loads((pruned_run / "run" / "prune.json").read_text())
    text = prune_markdown(record, compare=[("flap", "owl"), ("shift", "owl")])
    assert text.count("Further comparisons (report.compare)") == 2
    assert "| flap | vs owl |" in text and "| shift | vs owl |" in text
    spec = prune_spec(tmp_path)
    data = tomlkit.parse(spec.read_text())
    data["report"] = {"compare": [["flap", "owl"]]}
    spec.write_text(tomlkit.dumps(data))
    invoke("validate", str(spec))
    data["report"] = {"compare": [["flap", "nothing"]]}
    spec.write_text(tomlkit.dumps(data))
    result = CliRunner().invoke(cli, ["validate", str(spec)])
    output = result.output
    assert result.exit_code == 2, output
    assert "report.compare[0]" in output and "'nothing'" in output and "'owl'" in output


def test_one_finished_unit_is_exported_without_recomputing_any(tmp_path: Path) -> None:
    """A prune that exported nothing, asked afterwards for one model (`export = ["ARM@KEEP"]`,
    or `geospec prune --export ARM@KEEP --to DIR`): the stage keeps its key, no unit is
    computed again, only that arm's units at that keep write their model, and the model in
    --to (the checkpoint's tokenizer beside it) is the unit's, at its recorded widths."""
    spec = prune_spec(tmp_path, arms=PRUNE_SPEC["arms"][:2], export=False,
                      calibration={"windows": 8, "seeds": [0, 1]})  # fmt: skip
    invoke("prune", str(spec))
    run = tmp_path / "run"
    key = json.loads((run / "prune.json").read_text())["key"]
    units = sorted((run / "prune").glob("keep-*/*/seed-*/result.json"))
    before = {path: path.read_bytes() for path in units}
    assert not list((run / "prune").glob("keep-*/*/seed-*/model"))

    data = tomlkit.parse(spec.read_text())
    data["prune"]["export"] = ["flap@0.5"]
    spec.write_text(tomlkit.dumps(data))
    output = invoke("prune", str(spec))
    assert json.loads((run / "prune.json").read_text())["key"] == key
    assert {path: path.read_bytes() for path in units} == before  # nothing recomputed
    exported = sorted(
        p.parent.parent.relative_to(run) for p in run.glob("prune/*/*/*/model/config.json")
    )
    assert exported == [Path("prune/keep-0.5/flap/seed-0"), Path("prune/keep-0.5/flap/seed-1")]

    to = tmp_path / "flap-half"
    output = invoke("prune", str(spec), "--export", "flap@0.5", "--seed", "1", "--to", str(to))
    assert f"-> {to}" in output and "with its tokenizer" in output
    assert {path: path.read_bytes() for path in units} == before
    model = geospec.load_pruned(to)
    tokenizer = hf.AutoTokenizer.from_pretrained(to)
    text = (tmp_path / "other.jsonl").read_text().splitlines()
    assert tokenizer(json.loads(text[0])["text"])["input_ids"][:3]  # the word-level vocabulary
    record = json.loads(
        (run / "prune" / "keep-0.5" / "flap" / "seed-1" / "result.json").read_text()
    )
    widths = [int(layer.mlp.down_proj.in_features) for layer in model.model.layers]
    assert widths == record["widths"]
    assert not (to / "geospec-unit-key").exists()
    unit = geospec.load_pruned(run / "prune" / "keep-0.5" / "flap" / "seed-1" / "model")
    ids = torch.randint(0, 40, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, unit(input_ids=ids).logits)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--export", "nothing@0.5", "--to", "x"], "no [prune] arm is named 'nothing'"),
        (["--export", "flap@0.3", "--to", "x"], "must be one of prune.keep 0.75, 0.5"),
        (["--export", "flap@0.5", "--seed", "7", "--to", "x"], "--seed 7: not one of"),
        (["--export", "flap@0.5"], "--export ARM@KEEP and --to DIR go together"),
        (["--padded"], "--export ARM@KEEP and --to DIR go together"),
        (["--dtype", "q4_1"], "--export ARM@KEEP and --to DIR go together"),
        (["--export", "flap@0.5", "--to", "x", "--dtype", "q4_1"], "--dtype is for --format gguf"),
        (
            ["--dtype", "q4", "--export", "flap@0.5", "--to", "x.gguf"],
            "Invalid value for '--dtype'",
        ),
    ],
)
def test_a_bad_export_request_is_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    spec = prune_spec(tmp_path, arms=PRUNE_SPEC["arms"][:2], export=False)
    result = CliRunner().invoke(cli, ["prune", str(spec), *args])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert message in result.output
    assert not (tmp_path / "run" / "prune").exists()


def unit_records(run: Path) -> dict[str, bytes]:
    """Every unit's result.json, as bytes, by ``keep-F/ARM/seed-K``."""
    return {
        str(path.parent.relative_to(run / "prune")): path.read_bytes()
        for path in sorted((run / "prune").glob("keep-*/*/seed-*/result.json"))
    }


def test_a_subset_of_the_units_is_computed_and_a_full_prune_reuses_it(tmp_path: Path) -> None:
    """`geospec prune --arms cosine --keep 0.5` computes cosine's units (uneven widths) at keep
    0.5 (every calibration seed's) and no other, writes no prune.json and leaves the stage
    unrecorded, naming what is missing; the prune without the flags keeps its key (each subset
    unit's recorded key is the unit key of the full prune's), reuses those units byte for byte
    and computes the rest; the subset's units are those a prune of every unit computes afresh."""
    from geospec.prune.units import PruneKey, Unit, unit_key

    table = [
        {"name": "uniform", "schedule": {"kind": "uniform"}},
        {"name": "cosine", "schedule": {"kind": "cosine", "start": 1.2, "end": 0.8}},
    ]
    spec = prune_spec(tmp_path, arms=table, export=False,
                      calibration={"windows": 8, "seeds": [0, 1]})  # fmt: skip
    run = tmp_path / "run"
    output = invoke("prune", str(spec), "--arms", "cosine", "--keep", "0.5")
    subset = unit_records(run)
    assert set(subset) == {"keep-0.5/cosine/seed-0", "keep-0.5/cosine/seed-1"}
    assert len(set(json.loads(subset["keep-0.5/cosine/seed-0"])["widths"])) > 1
    assert not (run / "prune.json").exists()
    assert "prune" not in json.loads((run / "stages.json").read_text())
    said = " ".join(output.split())
    assert "6 unit(s) not chosen by --arms/--keep are not computed" in said
    for group in ("uniform@0.75 (seed 0, 1)", "cosine@0.75 (seed 0, 1)", "uniform@0.5 (seed 0, 1)"):
        assert group in said
    assert "without --arms and --keep" in said

    again = invoke("prune", str(spec), "--keep", "0.5", "--arms", "cosine")  # nothing to compute
    assert unit_records(run) == subset and "pruned models" not in again

    invoke("prune", str(spec))
    every = unit_records(run)
    assert len(every) == 8 and {name: every[name] for name in subset} == subset
    record = json.loads((run / "prune.json").read_text())
    key = PruneKey(record["key"], record["arm_keys"])
    assert json.loads((run / "stages.json").read_text())["prune"] == key
    for name, data in subset.items():
        keep, arm, seed = name.split("/")
        unit = Unit(float(keep.removeprefix("keep-")), arm, int(seed.removeprefix("seed-")))
        assert json.loads(data)["key"] == unit_key(key, unit)
    rerun = invoke("prune", str(spec), "--arms", "uniform")  # finished: the whole report
    assert "prune: up to date" in rerun and "## Pruning the reference" in rerun

    # what the subset computed is what a prune of every unit computes from scratch
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    invoke("prune", str(prune_spec(fresh, arms=table, export=False,
                                   calibration={"windows": 8, "seeds": [0, 1]})))  # fmt: skip
    for name, data in subset.items():
        ours, theirs = json.loads(data), json.loads(unit_records(fresh / "run")[name])
        assert (ours["widths"], ours["loss"]) == (theirs["widths"], theirs["loss"])


def test_a_grid_arm_is_chosen_by_its_name_or_a_settings(tmp_path: Path) -> None:
    """--arms with an expanded grid arm's name computes that setting alone; with the grid arm's
    name, every setting (the one already computed reused)."""
    arms = [
        {"name": "uniform", "schedule": {"kind": "uniform"}},
        {"name": "owl", "schedule": {"kind": "owl"}, "grid": {"lam": [0.02, 0.2]}},
    ]
    spec = prune_spec(tmp_path, arms=arms, keep=0.5, export=False,
                      calibration={"windows": 4, "seeds": [0]})  # fmt: skip
    run = tmp_path / "run"
    invoke("prune", str(spec), "--arms", "owl-lam0.2")
    first = unit_records(run)
    assert set(first) == {"keep-0.5/owl-lam0.2/seed-0"}
    output = invoke("prune", str(spec), "--arms", "owl")
    records = unit_records(run)
    assert set(records) == {"keep-0.5/owl-lam0.02/seed-0", "keep-0.5/owl-lam0.2/seed-0"}
    assert records["keep-0.5/owl-lam0.2/seed-0"] == first["keep-0.5/owl-lam0.2/seed-0"]
    assert "uniform@0.5 (seed 0)" in " ".join(output.split())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--arms", "flap,nothing"], "--arms: no [prune] arm is named 'nothing'"),
        (["--keep", "0.3"], "--keep 0.3: not one of prune.keep 0.75, 0.5"),
        (["--keep", "half"], "--keep half: give values separated by commas"),
        (["--arms", ","], "--arms ,: give values separated by commas"),
        (
            ["--arms", "flap", "--export", "uniform@0.5", "--to", "x"],
            "--export uniform@0.5: --arms/--keep leave this unit out",
        ),
    ],
)
def test_a_bad_unit_choice_is_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    spec = prune_spec(tmp_path, arms=PRUNE_SPEC["arms"][:2], export=False)
    result = CliRunner().invoke(cli, ["prune", str(spec), *args])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert message in result.output and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "run" / "prune").exists()


def _with_seeds(record: dict[str, Any], seeds: list[str]) -> dict[str, Any]:
    """prune.json as if the prune had run only ``seeds``."""
    kept = json.loads(json.dumps(record))
    kept["seeds"] = [int(s) for s in seeds]
    for budget in kept["budgets"]:
        for arm in budget["arms"].values():
            for field in ("loss", "window_loss"):
                for corpus, values in arm[field].items():
                    arm[field][corpus] = {s: v for s, v in values.items() if s in seeds}
    return kept


@pytest.mark.parametrize("seeds", [["0"], ["0", "1"], ["0", "1", "2"]])
def test_the_prune_table_prints_no_figure_its_seeds_cannot_back(
    pruned_run: Path, seeds: list[str]
) -> None:
    """The sign-flip p is printed only where the seeds can reach p <= 0.05 (6 of them: 2/2^n),
    the t interval from 3 seeds; the bootstrap over seeds x windows always, and with one seed
    the report says it resamples windows only."""
    from geospec.report.prune import budget_rows, prune_markdown

    record = _with_seeds(json.loads((pruned_run / "run" / "prune.json").read_text()), seeds)
    budget = record["budgets"][1]
    row = next(row for row in budget_rows(record, budget) if row[0] == "flap")
    assert row[8] == "-"  # 2/2^3 = 0.25 > 0.05: no seed count here can back a p
    assert (row[6] == "-") == (len(seeds) < 3)
    assert row[9].startswith("[") and row[10] != "-"
    text = prune_markdown(record)
    assert f"With {len(seeds)} calibration seed" in text
    assert ("resample the eval windows only" in text) == (len(seeds) == 1)
