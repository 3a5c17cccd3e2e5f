"""geospec export: a trained run as a transformers checkpoint that plain
AutoModelForCausalLM.from_pretrained loads, with its tokenizer, computing the same logits."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from geospec.cli import cli
from geospec.engine.checkpoint import load_model
from geospec.engine.export import native_per_layer_widths, to_transformers
from geospec.engine.model import GPT, GPTConfig
from geospec.engine.run_files import MODEL_FILE, RESULT_FILE
from geospec.engine.token_data import TokenData, shared_cache_dir

pytestmark = pytest.mark.torch

SPEC = """
name = "export"
measure = []

[model]
n_layers = 3
d_model = 32
n_heads = 4
ffn_width = 48
seq_len = 16
multiple_of = 8
{model}

[data]
source = "bundled:austen"
max_documents = 20
tokenizer = {{ kind = "bpe", vocab_size = 300 }}

[[arms]]
name = "uniform"
schedule = {{ kind = "uniform" }}

[train]
steps = 2
batch_size = 4
threads = 1
"""

FAMILIES = {
    "gpt2": "",
    "llama": 'activation = "swiglu"\nnorm = "rmsnorm"\npositions = "rope"\nbias = false\n'
    "tie_embeddings = false\nn_kv_heads = 2\nrope_theta = 500.0",
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One finished 2-step run per family, FFN widths 24, 80, 40."""
    tmp = tmp_path_factory.mktemp("export")
    return {family: train(tmp, family, "24,80,40") for family in FAMILIES}


def train(tmp: Path, family: str, widths: str) -> Path:
    spec = tmp / f"{family}.toml"
    spec.write_text(SPEC.format(model=FAMILIES[family]))
    out = tmp / f"{family}-run"
    args = ["train", str(spec), "--arm", "uniform", "--seed", "0", "--widths", widths]
    result = CliRunner().invoke(cli, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


@pytest.mark.parametrize("family", list(FAMILIES))
def test_export_round_trips_logits_and_tokenizer(
    tmp_path: Path, runs: dict[str, Path], family: str
) -> None:
    """Per-layer widths 24, 80, 40 are zero-padded to 80: the logits transformers computes from
    the exported directory equal geospec's (so the padded units contribute nothing)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run = runs[family]
    out = tmp_path / "hf"
    result = CliRunner().invoke(cli, ["export", str(run), "--to", str(out), "--format", "hf"])
    assert result.exit_code == 0, result.output
    assert "zero-padded to 80" in result.output
    hf = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    expected = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM"}[family]
    assert type(hf).__name__ == expected
    config = json.loads((out / "config.json").read_text())
    assert config["geospec"]["ffn_widths"] == [24, 80, 40]
    assert config["geospec"]["padded_to"] == 80
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    text = "It is a truth universally acknowledged, that a single man"
    key = json.loads((run / RESULT_FILE).read_text())["fingerprint"]["data"]
    ids = TokenData.open(shared_cache_dir() / key).tokenizer().encode(text).ids
    assert tokenizer(text)["input_ids"] == ids
    model = load_model(run)
    idx = torch.tensor([ids[:16], list(reversed(ids[:16]))])
    with torch.no_grad():
        ours, _ = model(idx)
        theirs = hf(idx).logits
    assert (ours - theirs).abs().max().item() < 1e-5


@pytest.mark.parametrize(
    ("activation", "norm", "positions", "bias", "tied"),
    [
        ("gelu", "layernorm", "learned", False, False),  # zero biases stand in for none
        ("swiglu", "rmsnorm", "rope", True, True),  # Llama's attention_bias and mlp_bias
    ],
)
def test_conversion_variants(
    activation: str, norm: str, positions: str, bias: bool, tied: bool
) -> None:
    torch.manual_seed(0)
    config = GPTConfig(
        vocab_size=70,
        n_layers=3,
        d_model=24,
        n_heads=3,
        seq_len=12,
        ffn_widths=[8, 40, 16],
        activation=activation,
        norm=norm,
        positions=positions,
        bias=bias,
        tie_embeddings=tied,
    )
    model = GPT(config).eval()
    for parameter in model.parameters():  # non-trivial norms and biases, not their init
        parameter.data.add_(0.05 * torch.randn_like(parameter))
    exported = to_transformers(model, eos_token_id=0, native=False)
    idx = torch.randint(0, 70, (2, 12))
    with torch.no_grad():
        difference = (model(idx)[0] - exported.model(idx).logits).abs().max().item()
    assert difference < 1e-5
    hidden = sum(p.numel() for n, p in exported.model.named_parameters() if "mlp" in n)
    assert exported.padded_to == 40 and hidden > sum(
        p.numel() for n, p in model.named_parameters() if ".ffn." in n
    )  # the padded checkpoint overstates the FFN parameters


def test_this_transformers_builds_no_per_layer_mlps() -> None:
    """transformers 5.24 stores per_layer_config but its GPT-2 and Llama build every MLP at one
    width (it refuses the heterogeneous config), so the export pads; a release that builds
    per-layer MLPs is detected and exported unpadded."""
    from transformers import LlamaConfig, LlamaForCausalLM

    per_layer: dict[str, Any] = {
        "per_layer_config": {0: {"intermediate_size": 4}, 1: {"intermediate_size": 12}}
    }
    try:
        with torch.device("meta"):
            model = LlamaForCausalLM(
                LlamaConfig(
                    vocab_size=8,
                    hidden_size=8,
                    num_hidden_layers=2,
                    num_attention_heads=2,
                    **per_layer,
                )
            )
        built = [layer.mlp.gate_proj.out_features for layer in model.model.layers]
    except Exception:
        built = None
    assert native_per_layer_widths("llama") == (built == [4, 12])


def test_unfinished_run_and_damaged_weights_are_refused(
    tmp_path: Path, runs: dict[str, Path]
) -> None:
    run = tmp_path / "run"
    shutil.copytree(runs["gpt2"], run)
    runner = CliRunner()
    (run / MODEL_FILE).write_bytes((run / MODEL_FILE).read_bytes()[:-8] + b"\0" * 8)
    damaged = runner.invoke(cli, ["export", str(run), "--to", str(tmp_path / "a")])
    assert damaged.exit_code == 2 and "does not match the hash" in damaged.output
    (run / RESULT_FILE).unlink()
    unfinished = runner.invoke(cli, ["export", str(run), "--to", str(tmp_path / "b")])
    assert unfinished.exit_code == 2 and "has not finished" in unfinished.output
    assert len(unfinished.output.strip().splitlines()) == 1
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_a_trained_llama_arm_exports_as_gguf_at_its_true_widths(
    tmp_path: Path, runs: dict[str, Path]
) -> None:
    """--format gguf: the Llama-family run at widths 24, 80, 40 (no padding in the file), its
    tokenizer as llama.cpp's gpt2 BPE; a GPT-2-family run is one line naming the fix."""
    gguf = pytest.importorskip("gguf", reason="the gguf extra: pip install 'geospec[gguf]'")
    from geospec.prune.gguf_export import gguf_widths

    out = tmp_path / "llama.gguf"
    args = ["export", str(runs["llama"]), "--to", str(out), "--format", "gguf", "--dtype", "f32"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert gguf_widths(out) == [24, 80, 40] and "FFN widths 24 80 40" in result.output
    reader = gguf.GGUFReader(str(out))
    assert reader.fields["tokenizer.ggml.pre"].contents() == "gpt-2"
    model = load_model(runs["llama"])
    stored = sum(int(t.n_elements) for t in reader.tensors)
    assert stored == sum(p.numel() for p in model.parameters())  # nothing padded
    gpt2 = tmp_path / "gpt2.gguf"
    refused = CliRunner().invoke(
        cli, ["export", str(runs["gpt2"]), "--to", str(gpt2), "--format", "gguf"]
    )
    assert refused.exit_code == 2 and "--format hf" in refused.output
    assert len(refused.output.strip().splitlines()) == 1 and not gpt2.exists()
