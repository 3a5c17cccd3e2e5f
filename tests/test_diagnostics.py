"""Diagnostics: TwoNN, layer sensitivity, additivity, their use in the solver, geospec diagnose."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hf_models
import numpy as np
import pytest
import tomlkit
import torch
import transformers as hf
from click.testing import CliRunner
from safetensors.torch import load_file
from torch import nn

from geospec.cli import cli
from geospec.engine.model import GPT, GPTConfig
from geospec.errors import GeospecError, SpecError
from geospec.kinds import ModelDims
from geospec.measure.intrinsic_dimension import fit_two_nn, two_nn
from geospec.measure.probe import find_ffn_sites
from geospec.measure.sensitivity import (
    additivity,
    layer_sensitivity,
    logits_of,
    mean_loss,
    r_squared,
    sample_pairs,
)
from geospec.registry.loading import get_registries
from geospec.spec.loading import load_spec, validate_spec
from geospec.testing import minimal_spec

pytestmark = pytest.mark.torch


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    """Tiny tensors: thread hand-offs would cost far more than the arithmetic on 2 busy cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# -- TwoNN -----------------------------------------------------------------------------------


def subspace_cloud(d: int, n: int = 2000, ambient: int = 60, seed: int = 0) -> np.ndarray:
    """Gaussian points on a random d-dimensional linear subspace of R^ambient, off the origin."""
    rng = np.random.default_rng(seed)
    basis, _ = np.linalg.qr(rng.standard_normal((ambient, d)))
    return rng.standard_normal((n, d)) @ basis.T + 3.0 * rng.standard_normal(ambient)


@pytest.mark.parametrize("d", [2, 5, 10])
def test_twonn_recovers_the_dimension_of_a_linear_subspace(d: int) -> None:
    estimate = two_nn(subspace_cloud(d))
    assert estimate.dimension == pytest.approx(d, rel=0.1)
    assert estimate.r2 > 0.99  # the Pareto line fits
    assert estimate.discarded == pytest.approx(0.1, abs=1e-3) and estimate.duplicates == 0


def test_twonn_fit_is_exact_on_pareto_quantiles() -> None:
    """Closed form: with mu at the exact quantiles of Pareto(d), -log(1 - F) = d log mu."""
    n, d = 500, 7.0
    quantiles = np.arange(1, n) / n
    r2 = np.append((1 - quantiles) ** (-1 / d), 1e9)  # the largest ratio is trimmed
    estimate = fit_two_nn(np.ones(n), r2, discard=0.1)
    assert estimate.dimension == pytest.approx(d, rel=1e-12)
    assert estimate.r2 == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("d", [2, 5, 10])
def test_twonn_matches_scikit_dimension(d: int) -> None:
    import skdim  # the test extra installs scikit-dimension: no silent skip

    cloud = subspace_cloud(d, n=800, seed=d)
    cloud[10] = cloud[11]  # an exact duplicate: both implementations drop the pair
    with pytest.warns(UserWarning, match="duplicate"):
        reference = skdim.id.TwoNN(discard_fraction=0.1).fit(cloud).dimension_
    estimate = two_nn(cloud, discard=0.1)
    assert estimate.duplicates == 2
    assert estimate.dimension == pytest.approx(reference, rel=1e-7)


def test_twonn_needs_enough_points() -> None:
    with pytest.raises(GeospecError, match="n >= 3"):
        two_nn(np.zeros((2, 4)))


# -- layer sensitivity -----------------------------------------------------------------------


def tiny_gpt(seed: int = 0, layers: int = 4, vocab: int = 50) -> GPT:
    torch.manual_seed(seed)
    config = GPTConfig(
        vocab_size=vocab,
        n_layers=layers,
        d_model=16,
        n_heads=2,
        seq_len=12,
        ffn_widths=[32] * layers,
    )
    return GPT(config).eval()


def random_batches(vocab: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return [
        (
            torch.randint(0, vocab, (3, 12), generator=generator),
            torch.randint(0, vocab, (3, 12), generator=generator),
        )
        for _ in range(2)
    ]


def sites_of(model: nn.Module, width: int, batches: list[Any]) -> list[Any]:
    return find_ffn_sites(model, width, lambda: logits_of(model, batches[0][0][:1]))


def test_a_zeroed_ffn_has_exactly_zero_sensitivity() -> None:
    model = tiny_gpt()
    with torch.no_grad():
        model.blocks[2].ffn.proj.weight.zero_()
        model.blocks[2].ffn.proj.bias.zero_()
    batches = random_batches(50)
    result = layer_sensitivity(model, sites_of(model, 16, batches), batches, eps=0.1)
    assert result.scale[2] == 0.0 and result.remove[2] == 0.0
    assert all(result.scale[i] != 0.0 and result.remove[i] != 0.0 for i in (0, 1, 3))


def scaled_weights_loss(
    model: nn.Module, batches: list[Any], changed: nn.Linear, s: float
) -> float:
    """The loss with one FFN's output projection multiplied by s (a different mechanism)."""
    saved = {name: p.detach().clone() for name, p in changed.named_parameters()}
    with torch.no_grad():
        for p in changed.parameters():
            p.mul_(s)
    try:
        return mean_loss(model, batches)
    finally:
        with torch.no_grad():
            for name, p in changed.named_parameters():
                p.copy_(saved[name])


def llama() -> nn.Module:
    return hf_models.llama(intermediate_size=48)


@pytest.mark.parametrize("kind", ["geospec", "llama"])
def test_hooks_match_scaling_the_ffn_weights(kind: str) -> None:
    """Scaling the sub-layer's output by hooks = scaling the FFN's (bias and) output projection."""
    if kind == "geospec":
        model, width = tiny_gpt(seed=1, layers=3, vocab=97), 16
        linears = [block.ffn.proj for block in model.blocks]
    else:
        model, width = llama(), 32
        linears = [layer.mlp.down_proj for layer in model.model.layers]
    batches = random_batches(97)
    result = layer_sensitivity(model, sites_of(model, width, batches), batches, eps=0.25)
    base = mean_loss(model, batches)
    assert result.base == base
    for layer in range(3):
        scaled = scaled_weights_loss(model, batches, linears[layer], 0.75) - base
        removed = scaled_weights_loss(model, batches, linears[layer], 0.0) - base
        assert result.scale[layer] == pytest.approx(scaled, rel=1e-4, abs=1e-7)
        assert result.remove[layer] == pytest.approx(removed, rel=1e-4, abs=1e-7)


# -- additivity ------------------------------------------------------------------------------


class ConstantFFN(nn.Module):
    """An FFN whose output does not depend on its input: proj(gelu(b)), b a random bias."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, 2 * width)
        self.proj = nn.Linear(2 * width, width)
        with torch.no_grad():
            self.fc.weight.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.proj(nn.functional.gelu(self.fc(x)))
        return out


class NonInteractingBlock(nn.Module):
    """A pre-norm block whose "attention" adds nothing and whose FFN adds a constant vector c_l:
    the final residual is h0 + sum_l s_l c_l, so no layer changes what another one adds."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attn = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.ffn = ConstantFFN(width)
        with torch.no_grad():
            self.attn.weight.zero_()
            self.attn.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.ffn(self.norm2(x))


class NonInteractingModel(nn.Module):
    def __init__(self, vocab: int = 50, width: int = 8, layers: int = 6) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(NonInteractingBlock(width) for _ in range(layers))
        self.readout = nn.Parameter(torch.randn(width))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.wte(ids)
        for block in self.blocks:
            x = block(x)
        return x


def linear_loss(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """A loss linear in the final residual stream, hence in every FFN's output."""
    out: torch.Tensor = (model(inputs) @ model.readout).sum()
    return out


def test_additivity_is_exact_when_layers_do_not_interact() -> None:
    torch.manual_seed(0)
    model = NonInteractingModel().double()
    batches = random_batches(50)
    sites = find_ffn_sites(model, 8, lambda: model(batches[0][0][:1]))
    single = layer_sensitivity(model, sites, batches, eps=0.1, loss=linear_loss)
    pairs = sample_pairs(6, 15, seed=0)
    result = additivity(model, sites, batches, single, pairs, loss=linear_loss)
    assert len(result.pairs) == 15
    assert result.r2 == pytest.approx(1.0, abs=1e-10)
    scale = max(abs(p.joint) for p in result.pairs)
    assert all(abs(p.interaction) <= 1e-10 * scale for p in result.pairs)


def test_additivity_of_an_interacting_model_is_not_exact() -> None:
    model = tiny_gpt(seed=2)
    batches = random_batches(50)
    sites = sites_of(model, 16, batches)
    single = layer_sensitivity(model, sites, batches, eps=0.5)
    result = additivity(model, sites, batches, single, sample_pairs(4, 6, seed=0))
    assert result.r2 is not None and result.r2 < 1.0
    assert result.worst(2)[0] == max(result.pairs, key=lambda p: abs(p.interaction))


def test_pairs_are_seeded_distinct_and_capped() -> None:
    a = sample_pairs(10, 12, seed=3)
    assert a == sample_pairs(10, 12, seed=3) and a != sample_pairs(10, 12, seed=4)
    assert len(set(a)) == 12 and all(0 <= i < j < 10 for i, j in a)
    assert sample_pairs(4, 100, seed=0) == [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]
    assert sample_pairs(1, 5, seed=0) == []


def test_r_squared() -> None:
    assert r_squared([1.0, 2.0, 4.0], [1.0, 2.0, 4.0]) == 1.0
    # predicting the mean explains nothing
    assert r_squared([1.0, 2.0, 3.0], [2.0, 2.0, 2.0]) == pytest.approx(0.0)
    assert r_squared([2.0, 2.0], [1.0, 3.0]) is None


def test_r_squared_of_no_pairs_is_none_without_a_warning() -> None:
    """diagnose with pairs = 0 (the SmolLM2 prune study) fits nothing and says nothing."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert r_squared([], []) is None
        assert r_squared([1.0], [2.0]) is None


# -- spec ------------------------------------------------------------------------------------

INFORMED = {
    "kind": "geometric",
    "profile": "shift/spherical",
    "sensitivity": "sensitivity/scale",
    "intrinsic_dimension": "intrinsic_dimension/twonn",
}


def test_diagnostic_profiles_need_the_diagnose_stage() -> None:
    arms = [
        {"name": "uniform", "schedule": {"kind": "uniform"}},
        {"name": "a", "schedule": INFORMED},
    ]
    measure = [{"geometry": "spherical", "statistic": "shift"}]
    with pytest.raises(SpecError) as error:
        validate_spec(minimal_spec(arms=arms, measure=measure))
    message = str(error.value)
    assert "arms[1].schedule.sensitivity" in message and "[diagnose] enabled = true" in message
    assert "arms[1].schedule.intrinsic_dimension" in message
    spec = validate_spec(minimal_spec(arms=arms, measure=measure, diagnose={"enabled": True}))
    assert spec.diagnose.eps == 0.1


# -- geospec diagnose end to end -------------------------------------------------------------

SPEC = """
name = "diagnose-test"
probe_only = true

[model]
n_layers = 4
d_model = 32
n_heads = 2
ffn_width = 64
seq_len = 32
multiple_of = 8

[data]
source = "bundled:austen"
tokenizer = { kind = "bpe", vocab_size = 400 }
max_documents = 400

[reference]
train_steps = 40

[probe]
tokens = 160
seed = 3

[diagnose]
enabled = true
eps = 0.2
windows = 12
pairs = 4

[[measure]]
geometry = { kind = "raw" }
statistic = { kind = "shift" }

[[measure]]
geometry = { kind = "spherical" }
statistic = { kind = "shift" }

[[arms]]
name = "uniform"
schedule = { kind = "uniform" }

[[arms]]
name = "plain"
schedule = { kind = "geometric", profile = "shift/spherical" }

[[arms]]
name = "informed"
schedule = { kind = "geometric", profile = "shift/spherical", sensitivity = "sensitivity/remove", \
intrinsic_dimension = "intrinsic_dimension/twonn" }

[train]
steps = 40
batch_size = 8
lr = 3e-3
threads = 1
"""


def invoke(*args: str) -> str:
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code == 0, result.output + repr(result.exception)
    return result.output


@pytest.fixture(scope="module")
def diagnosed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("diagnose")
    document = tomlkit.parse(SPEC)
    document["out"] = str(directory / "run")
    (directory / "spec.toml").write_text(tomlkit.dumps(document))
    output = invoke("diagnose", str(directory / "spec.toml"))
    assert "diagnostics: per layer" in output and "arm" not in output
    (directory / "output.txt").write_text(output)
    return directory


def test_long_loops_report_progress_in_logs(diagnosed: Path) -> None:
    """Not on a terminal (CliRunner), every long loop prints its last count: the probe stage's
    windows (4 x 160 tokens / 32 per window: 20), TwoNN per layer, and one perturbation of one
    batch per unit (3 batches x (2 x 4 layers + 4 pairs)); no note of full forward passes
    (geospec's model runs from the perturbed layer on)."""
    output = (diagnosed / "output.txt").read_text()
    assert "probing: 20/20" in output
    assert "TwoNN: 4/4" in output and "perturbing: 36/36" in output
    assert "full forward passes" not in output


def test_diagnose_writes_diagnostics_and_trains_no_arm(diagnosed: Path) -> None:
    run_dir = diagnosed / "run"
    diagnostics = json.loads((run_dir / "diagnostics.json").read_text())
    assert (run_dir / "plots" / "diagnostics.png").exists()
    assert (run_dir / "plots" / "additivity.png").exists()
    assert not (run_dir / "arms").exists() and not (run_dir / "widths.json").exists()
    layers = diagnostics["layers"]
    assert [row["layer"] for row in layers] == [0, 1, 2, 3]
    assert len(diagnostics["additivity"]["pairs"]) == 4
    assert set(diagnostics["correlations"]) == {"shift/raw", "shift/spherical"}
    assert diagnostics["correlations"]["shift/raw"]["scale_sensitive"]
    assert not diagnostics["correlations"]["shift/spherical"]["scale_sensitive"]
    for name, values in diagnostics["profiles"].items():
        assert len(values) == 4 and all(v >= 0 for v in values), name
    # the residual norm is the mean norm of the stored clouds' states
    for row in layers:
        cloud = load_file(str(run_dir / "clouds" / f"layer-{row['layer']:03d}.safetensors"))
        assert row["residual_norm"] == pytest.approx(float(cloud["x"].norm(dim=1).mean()), 1e-6)
        assert row["twonn"]["dimension"] == pytest.approx(two_nn(cloud["x"]).dimension)


def test_base_loss_is_the_models_own_cross_entropy(diagnosed: Path) -> None:
    from geospec.engine.batches import window_tensors
    from geospec.engine.checkpoint import load_model
    from geospec.engine.token_data import prepare_data

    run_dir = diagnosed / "run"
    spec = load_spec(diagnosed / "spec.toml")
    data = prepare_data(spec.data, run_dir / "data", spec_dir=diagnosed)
    model = load_model(run_dir / "reference")
    x, y = window_tensors(data.val, np.arange(12), 32)
    with torch.no_grad():
        _, loss = model(x, y)
    base = json.loads((run_dir / "diagnostics.json").read_text())["loss"]["base"]
    assert base == pytest.approx(float(loss), rel=1e-5)


def test_the_solver_uses_diagnostic_profiles(diagnosed: Path) -> None:
    spec_path = diagnosed / "spec.toml"
    output = invoke("run", str(spec_path))
    assert "diagnose: up to date" in output and "probe-only" in output
    run_dir = diagnosed / "run"
    widths = {
        k: v["widths"] for k, v in json.loads((run_dir / "widths.json").read_text())["arms"].items()
    }
    assert widths["informed"] != widths["plain"]
    assert all(sum(w) == 4 * 64 and all(x % 8 == 0 for x in w) for w in widths.values())
    # the same widths from the solver called directly with the diagnostic profiles
    diagnostics = json.loads((run_dir / "diagnostics.json").read_text())["profiles"]
    work = json.loads((run_dir / "profiles.json").read_text())["profiles"]["shift/spherical"]
    problem = ModelDims(4, 32, 64, 8).width_problem(
        work,
        exponents=[2 / d for d in diagnostics["intrinsic_dimension/twonn"]],
        sensitivities=diagnostics["sensitivity/remove"],
    )
    registries = get_registries()
    solver = registries.create("solver", registries["solver"].get("power_law").cls.Params())
    assert widths["informed"] == solver.solve(problem)
    report = (run_dir / "report.md").read_text()
    assert "## Diagnostics of the reference model" in report and "plots/additivity.png" in report


def test_rerun_is_skipped_and_a_new_profile_only_adds_correlations(diagnosed: Path) -> None:
    spec_path = diagnosed / "spec.toml"
    assert "diagnose: up to date" in invoke("diagnose", str(spec_path))
    before = json.loads((diagnosed / "run" / "diagnostics.json").read_text())
    spec_path.write_text(
        spec_path.read_text().replace(
            "[[arms]]",
            '[[measure]]\ngeometry = { kind = "hyperbolic" }\nstatistic = { kind = "shift" }\n\n'
            "[[arms]]",
            1,
        )
    )
    output = invoke("diagnose", str(spec_path))
    assert "measure: 1 profiles" in output and "diagnose: 4 layers" not in output  # reused
    after = json.loads((diagnosed / "run" / "diagnostics.json").read_text())
    assert after["layers"] == before["layers"]
    assert "shift/hyperbolic" in after["correlations"]


def test_diagnose_a_pretrained_checkpoint(tmp_path: Path) -> None:
    """A Hugging Face checkpoint on disk (a tiny Llama and a word-level tokenizer), probed at
    both sites: the residual norms agree (the ffn site probes the residual stream again)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "</s>": 1} | {f"w{i}": i + 2 for i in range(95)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    hf.PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="</s>", unk_token="[UNK]"
    ).save_pretrained(tmp_path / "model")
    llama().save_pretrained(tmp_path / "model")
    rng = np.random.default_rng(0)
    lines = [json.dumps({"text": " ".join(f"w{j}" for j in rng.integers(0, 95, 60))})]
    (tmp_path / "docs.jsonl").write_text("\n".join(lines * 200))
    layers = {}
    for site in ("residual", "ffn"):
        spec = minimal_spec(
            out=str(tmp_path / site),
            data={"files": ["docs.jsonl"], "tokenizer": {"kind": "pretrained", "path": ""}},
            reference={"checkpoint": str(tmp_path / "model")},
            probe={"tokens": 64, "site": site},
            measure=[{"geometry": "raw", "statistic": "shift"}],
            diagnose={"windows": 4, "pairs": 2},
            probe_only=True,
        )
        spec["data"]["tokenizer"]["path"] = str(tmp_path / "model")
        # [model] holds only the spec's own choices; the rest is read from config.json
        spec["model"] = {"seq_len": spec["model"]["seq_len"], "multiple_of": 16}
        (tmp_path / "spec.toml").write_text(tomlkit.dumps(spec))
        output = invoke("diagnose", str(tmp_path / "spec.toml"))
        # the ffn site probes the residual stream again, a loop that reports its progress too
        assert ("probing the residual stream: " in output) == (site == "ffn")
        layers[site] = json.loads((tmp_path / site / "diagnostics.json").read_text())["layers"]
    assert len(layers["residual"]) == 3  # the checkpoint's depth, not model.n_layers
    assert all(row["loss_remove"] != 0 for row in layers["residual"])
    for a, b in zip(layers["residual"], layers["ffn"], strict=True):
        assert a["residual_norm"] == pytest.approx(b["residual_norm"], rel=1e-6)
        assert a["loss_scale"] == b["loss_scale"]  # the loss does not depend on the probe site
