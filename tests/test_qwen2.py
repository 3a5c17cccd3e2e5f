"""Qwen2 (transformers' Qwen2ForCausalLM: Llama's layer with biases on the query, key and value
projections) through the prune path: a tiny random Qwen2 built here, cut, compensated, exported
at true widths and padded, imported into geospec's engine for healing, written as llama.cpp's
deci GGUF, and pruned end to end by `geospec prune`. The truth is transformers' own logits of
the same pruned model, the gguf package's reader, and llama.cpp's deci graph computed in numpy
from the file's tensors as llama.cpp names and lays them out."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf_models
import numpy as np
import pytest
import tomlkit
import torch
import transformers as hf
from click.testing import CliRunner

import geospec
from geospec.cli import cli
from geospec.engine.imported import import_llama, import_problem, load_into_llama
from geospec.errors import UsageError
from geospec.measure.calibration import calibration_stats
from geospec.measure.cut import compensation_bias, kept_neurons
from geospec.measure.probe import FFNSite, find_ffn_sites
from geospec.measure.sensitivity import logits_of
from geospec.plugin import create_plugin
from geospec.prune.cut import pruned
from geospec.prune.hf_export import compensated_export_problem, export_pruned
from geospec.prune.repair import Refit, calibration_moments, one_pass_refits
from geospec.prune.score import calibration_windows, neuron_scores

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_torch_thread")]

D_MODEL, FULL, HEADS, KV_HEADS = 32, 64, 4, 2
WIDTHS = [32, 64, 16]  # the middle layer keeps every neuron


def qwen2(vocab: int = 97, tied: bool = False, seed: int = 0) -> hf.Qwen2ForCausalLM:
    """A random 3-layer Qwen2 (grouped-query attention, rope theta 1000) whose attention biases
    and norms are not their zero / one init, so that a lost or misplaced bias shows."""
    torch.manual_seed(seed)
    config = hf.Qwen2Config(
        vocab_size=vocab,
        hidden_size=D_MODEL,
        intermediate_size=FULL,
        num_hidden_layers=3,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=64,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 1000.0},
        tie_word_embeddings=tied,
        bos_token_id=1,
        eos_token_id=1,
    )
    model = hf.Qwen2ForCausalLM(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name or name.endswith(".bias"):
                parameter.add_(0.3 * torch.randn_like(parameter))
            elif "mlp" in name:  # larger FFN weights: a cut or a compensation shows in the logits
                parameter.mul_(4)
    return model


def ids(vocab: int = 97, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (2, 12), generator=torch.Generator().manual_seed(seed))


def down(site: FFNSite) -> torch.nn.Linear:
    """The FFN's down projection (its output: the hidden activations are its input)."""
    module = site.ffn.down_proj
    assert isinstance(module, torch.nn.Linear)
    return module


def sites_of(model: torch.nn.Module) -> list[FFNSite]:
    return find_ffn_sites(model, D_MODEL, lambda: logits_of(model, ids()[:1]))


def orders_and_means(model: torch.nn.Module) -> tuple[list[list[int]], list[torch.Tensor]]:
    """Every layer's neuron ordering by FLAP's fluctuation score and the calibration means."""
    sites = sites_of(model)
    tokens = np.random.default_rng(0).integers(0, 97, 400)
    starts = calibration_windows(tokens, 16, 8, seed=0)
    stats = calibration_stats(model, sites, tokens, starts, 16, 4)
    importance = create_plugin("importance", {"kind": "fluctuation"})
    _, orders = neuron_scores(model, sites, importance, tokens, starts, 16, 4, stats=stats)
    return orders, [s.mean for s in stats]


def test_the_cut_keeps_the_attention_biases_and_equals_zeroed_activations() -> None:
    """Every layer's FFN is found as gate/up/down; the pruned model is transformers' Qwen2 with
    the removed neurons' activations zeroed by a hook, and its attention biases are untouched."""
    model = qwen2()
    orders, _ = orders_and_means(model)
    sites = sites_of(model)
    handles = []
    for site, order, width in zip(sites, orders, WIDTHS, strict=True):
        removed = sorted(order[width:])
        handles.append(down(site).register_forward_pre_hook(zeroing(removed)))
    with torch.no_grad():
        reference = model(input_ids=ids()).logits
    for handle in handles:
        handle.remove()
    with torch.no_grad(), pruned(sites, orders, WIDTHS):
        got = model(input_ids=ids()).logits
        assert [down(s).in_features for s in sites] == WIDTHS
        assert all(down(s).bias is None for s in sites)
    torch.testing.assert_close(got, reference, atol=1e-5, rtol=1e-5)
    assert all(layer.self_attn.q_proj.bias.abs().sum() > 0 for layer in model.model.layers)


@pytest.mark.parametrize("kind", ["activation", "fluctuation", "wanda_sp", "magnitude", "random"])
def test_every_importance_scores_each_qwen2_neuron_from_its_own_matrices_and_activations(
    kind: str,
) -> None:
    """Each builtin importance gives one finite score per neuron of every layer, its ordering
    best first; the activation-free magnitude is recomputed here from transformers' modules,
    and the activation score from the hidden activations a hook records."""
    model = qwen2()
    sites = sites_of(model)
    tokens = np.random.default_rng(0).integers(0, 97, 400)
    starts = calibration_windows(tokens, 16, 8, seed=0)
    importance = create_plugin("importance", {"kind": kind})
    scores, orders = neuron_scores(model, sites, importance, tokens, starts, 16, 4)
    seen: list[list[torch.Tensor]] = [[] for _ in sites]
    handles = [
        down(site).register_forward_pre_hook(
            lambda module, args, i=i: seen[i].append(args[0].detach().reshape(-1, FULL))
        )
        for i, site in enumerate(sites)
    ]
    with torch.no_grad():
        for start in starts:
            model(input_ids=torch.as_tensor(tokens[start : start + 16])[None])
    for handle in handles:
        handle.remove()
    for layer, (site, got, order) in enumerate(zip(sites, scores, orders, strict=True)):
        assert len(got) == FULL and np.isfinite(got).all()
        assert [got[i] for i in order] == sorted(got, reverse=True)
        mlp = site.ffn
        column = down(site).weight.detach().double().norm(dim=0)
        if kind == "magnitude":
            rows = [
                getattr(mlp, n).weight.detach().double().norm(dim=1)
                for n in ("gate_proj", "up_proj")
            ]
            np.testing.assert_allclose(got, (column * rows[0] * rows[1]).numpy(), rtol=1e-5)
        if kind == "activation":
            mean_abs = torch.cat(seen[layer]).double().abs().mean(dim=0)
            np.testing.assert_allclose(got, (mean_abs * column).numpy(), rtol=1e-4)


def zeroing(removed: list[int], values: torch.Tensor | None = None) -> Callable[..., tuple]:
    """A pre-hook on a down projection setting the ``removed`` activations to 0 (or ``values``)."""

    def hook(module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor]:
        hidden = args[0].clone()
        hidden[..., removed] = 0 if values is None else values[removed].to(hidden.dtype)
        return (hidden,)

    return hook


@pytest.mark.parametrize("tied", [False, True])
def test_true_width_and_padded_exports_compute_the_pruned_logits(
    tmp_path: Path, tied: bool
) -> None:
    model = qwen2(tied=tied)
    orders, _ = orders_and_means(model)
    sites = sites_of(model)
    with torch.no_grad(), pruned(sites, orders, WIDTHS):
        expected = model(input_ids=ids()).logits
        true = export_pruned(model, sites, WIDTHS, tmp_path / "true")
        padded = export_pruned(model, sites, WIDTHS, tmp_path / "padded", padded=True)
    loaded = geospec.load_pruned(tmp_path / "true")
    plain = hf.AutoModelForCausalLM.from_pretrained(tmp_path / "padded").eval()
    for reloaded in (loaded, plain):
        assert isinstance(reloaded, hf.Qwen2ForCausalLM)
        assert reloaded.config.geospec["ffn_widths"] == WIDTHS
        with torch.no_grad():
            got = reloaded(input_ids=ids()).logits
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert [layer.mlp.down_proj.in_features for layer in loaded.model.layers] == WIDTHS
    # the file holds the true widths, the attention biases included in the count
    assert true.parameters == sum(p.numel() for p in loaded.parameters())
    assert padded.parameters - true.parameters == sum(64 - w for w in WIDTHS) * 3 * D_MODEL


def test_a_compensated_cut_is_exact_and_its_true_width_export_carries_the_bias(
    tmp_path: Path,
) -> None:
    """The compensated Qwen2 equals the full one with each removed activation at its calibration
    mean. Transformers' Qwen2 MLP has no bias option, yet the true-width export carries the
    down-projection bias: load_pruned gives each output projection the stored bias (a zero one
    on the layer that kept every neuron) and computes the same logits; the padded checkpoint,
    whose MLP plain transformers would build without it, is refused in one line, unwritten."""
    model = qwen2()
    orders, means = orders_and_means(model)
    sites = sites_of(model)
    handles = [
        down(site).register_forward_pre_hook(zeroing(sorted(order[width:]), mean))
        for site, order, width, mean in zip(sites, orders, WIDTHS, means, strict=True)
    ]
    with torch.no_grad():
        reference = model(input_ids=ids()).logits
    for handle in handles:
        handle.remove()
    problem = compensated_export_problem(model)
    assert problem is not None and "qwen2 MLP has no bias" in problem and "mlp_bias" in problem
    with torch.no_grad(), pruned(sites, orders, WIDTHS, compensation=means):
        got = model(input_ids=ids()).logits
        biases = [down(site).bias for site in sites]
        export_pruned(model, sites, WIDTHS, tmp_path / "true")
        with pytest.raises(UsageError) as caught:
            export_pruned(model, sites, WIDTHS, tmp_path / "x", padded=True)
    torch.testing.assert_close(got, reference, atol=5e-5, rtol=1e-5)
    said = str(caught.value)
    assert "qwen2 MLP has no bias" in said and "\n" not in said and "leave --padded out" in said
    assert not (tmp_path / "x").exists()
    loaded = geospec.load_pruned(tmp_path / "true")
    assert type(loaded) is hf.Qwen2ForCausalLM and not hasattr(loaded.config, "mlp_bias")
    for layer, bias in zip(loaded.model.layers, biases, strict=True):
        assert layer.mlp.gate_proj.bias is None and layer.mlp.up_proj.bias is None
        expected = torch.zeros(D_MODEL) if bias is None else bias  # the middle layer: whole
        torch.testing.assert_close(layer.mlp.down_proj.bias, expected, atol=0, rtol=0)
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids()).logits, got, atol=1e-6, rtol=1e-6)


def refits_of(
    model: torch.nn.Module, orders: list[list[int]], intercept: bool = True
) -> list[Refit | None]:
    """The least-squares repair of every cut layer of ``WIDTHS`` from the unpruned model's
    moments on other token ids than the tests read (None: the middle layer, kept whole)."""
    calibration = ids(seed=1)
    moments = calibration_moments(model, sites_of(model), [(calibration, calibration)])
    return one_pass_refits(sites_of(model), moments, orders, WIDTHS, 0.01, intercept)


@pytest.mark.parametrize("repair", ["none", "mean", "lstsq"])
def test_healing_imports_and_exports_a_pruned_qwen2_with_its_biases(repair: str) -> None:
    """import_llama gives geospec's model the attention biases (qkv_bias), the down projections'
    biases of a repair (the least-squares re-fit's intercept too, where the middle layer, kept
    whole, is not re-fitted) and transformers' logits; load_into_llama writes changed weights
    and biases back, so the two agree again."""
    model = qwen2()
    orders, means = orders_and_means(model)
    sites = sites_of(model)
    refits = refits_of(model, orders) if repair == "lstsq" else None
    compensation = means if repair == "mean" else None
    with torch.no_grad(), pruned(sites, orders, WIDTHS, compensation, refits):
        assert import_problem(model) is None
        gpt = import_llama(model, 16)
        assert gpt.config.qkv_bias and not gpt.config.bias
        assert gpt.config.ffn_out_bias == (repair != "none") and gpt.config.ffn_widths == WIDTHS
        assert gpt.num_params() == sum(p.numel() for p in model.parameters())
        assert gpt.config.num_params() == gpt.num_params()
        expected = model(input_ids=ids()).logits
        got, _ = gpt(ids())
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
        for parameter in gpt.parameters():  # "training": every weight and bias moves
            parameter.add_(0.01 * torch.randn_like(parameter))
        load_into_llama(model, gpt)
        moved, _ = gpt(ids())
        torch.testing.assert_close(model(input_ids=ids()).logits, moved, atol=1e-5, rtol=1e-5)
        assert (moved - expected).abs().max() > 1e-3


@pytest.mark.parametrize("intercept", [True, False])
def test_a_layer_kept_whole_beside_refits_with_an_intercept_has_a_zero_bias(
    intercept: bool,
) -> None:
    """The re-fit with its intercept gives the cut layers' down projections a bias; the middle
    layer, kept whole and so not re-fitted, gets a zero one (issue 54: geospec's engine imports
    no model whose FFN output biases are on some layers only), its weight the unpruned one, and
    the model computes what it computes with that layer's own projection, without a bias. The
    re-fit without an intercept gives no layer a bias, as before."""
    model = qwen2()
    orders, _ = orders_and_means(model)
    sites = sites_of(model)
    unpruned = down(sites[1])
    refits = refits_of(model, orders, intercept)
    assert refits[1] is None
    with torch.no_grad(), pruned(sites, orders, WIDTHS, refits=refits):
        whole = down(sites[1])
        assert [down(site).bias is not None for site in sites] == [intercept] * 3
        assert torch.equal(whole.weight, unpruned.weight)
        got = model(input_ids=ids()).logits
        if intercept:
            assert not whole.bias.any()
            sites[1].ffn.down_proj = unpruned
            expected = model(input_ids=ids()).logits
            sites[1].ffn.down_proj = whole
            torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-6)
    assert down(sites[1]) is unpruned and unpruned.bias is None  # put back as it was


def test_geospecs_model_of_a_qwen2_exports_as_a_llama_with_attention_biases() -> None:
    """geospec's own export of the imported Qwen2 (a heal run's checkpoint, say): transformers'
    Llama with attention_bias (a zero o_proj bias), the same logits."""
    from geospec.engine.export import to_transformers

    model = qwen2()
    orders, _ = orders_and_means(model)
    sites = sites_of(model)
    with torch.no_grad(), pruned(sites, orders, WIDTHS):
        expected = model(input_ids=ids()).logits
        exported = to_transformers(import_llama(model, 16), eos_token_id=1)
    assert exported.model.config.attention_bias is True
    assert not exported.model.model.layers[0].self_attn.o_proj.bias.any()
    with torch.no_grad():
        got = exported.model(input_ids=ids()).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_what_healing_cannot_import_from_a_qwen2_is_one_line() -> None:
    sliding = hf.Qwen2ForCausalLM(
        hf.Qwen2Config(**TINY, use_sliding_window=True, sliding_window=4, max_window_layers=0)
    )
    assert "sliding window of 4" in (import_problem(sliding) or "")
    half = qwen2()
    half.model.layers[1].self_attn.k_proj.bias = None
    assert "some of its query, key and value" in (import_problem(half) or "")
    with pytest.raises(UsageError, match="cannot import this checkpoint"):
        import_llama(half, 16)


TINY: dict[str, Any] = {"vocab_size": 97, "hidden_size": 32, "intermediate_size": 64,
                        "num_hidden_layers": 2, "num_attention_heads": 4,
                        "num_key_value_heads": 2}  # fmt: skip


# -- GGUF: llama.cpp's deci with Qwen2's biases ------------------------------------------------


def deci_logits(path: Path, tokens: list[int]) -> np.ndarray:
    """The logits llama.cpp's deci graph (src/models/deci.cpp) computes from the GGUF file at
    ``path``, in float64 numpy: every tensor read by its llama.cpp name (a quantized one
    de-quantized by gguf-py), the optional biases added where the file has them, rope on
    consecutive pairs (LLAMA_ROPE_TYPE_NORM), each query head reading key/value head
    h // (heads / kv_heads)."""
    gguf = pytest.importorskip("gguf")
    reader = gguf.GGUFReader(str(path))
    meta = {key: field.contents() for key, field in reader.fields.items()}
    t = {
        tensor.name: gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        .astype(np.float64)
        .reshape(tuple(reversed([int(n) for n in tensor.shape])))
        for tensor in reader.tensors
    }
    heads, kv_heads = meta["deci.attention.head_count"], meta["deci.attention.head_count_kv"]
    eps, base = meta["deci.attention.layer_norm_rms_epsilon"], meta["deci.rope.freq_base"]
    head_dim = meta["deci.rope.dimension_count"]

    def norm(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * weight

    def linear(x: np.ndarray, name: str) -> np.ndarray:
        y = x @ t[f"{name}.weight"].T
        return y + t[f"{name}.bias"] if f"{name}.bias" in t else y

    def rope(x: np.ndarray) -> np.ndarray:  # (T, heads, head_dim), pairs (2i, 2i + 1)
        pos = np.arange(len(x))[:, None]
        angle = pos * base ** (-np.arange(0, head_dim, 2) / head_dim)
        cos, sin = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]
        even, odd = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2], out[..., 1::2] = even * cos - odd * sin, even * sin + odd * cos
        return out

    n = len(tokens)
    x = t["token_embd.weight"][tokens]
    mask = np.triu(np.full((n, n), -np.inf), 1)
    for i in range(meta["deci.block_count"]):
        b = f"blk.{i}"
        h = norm(x, t[f"{b}.attn_norm.weight"])
        q = rope(linear(h, f"{b}.attn_q").reshape(n, heads, head_dim))
        k = rope(linear(h, f"{b}.attn_k").reshape(n, kv_heads, head_dim))
        v = linear(h, f"{b}.attn_v").reshape(n, kv_heads, head_dim)
        group = heads // kv_heads
        out = np.empty((n, heads, head_dim))
        for head in range(heads):
            scores = q[:, head] @ k[:, head // group].T / np.sqrt(head_dim) + mask
            weights = np.exp(scores - scores.max(-1, keepdims=True))
            out[:, head] = (weights / weights.sum(-1, keepdims=True)) @ v[:, head // group]
        x = x + linear(out.reshape(n, -1), f"{b}.attn_output")
        h = norm(x, t[f"{b}.ffn_norm.weight"])
        gate = linear(h, f"{b}.ffn_gate")
        x = x + linear(gate / (1 + np.exp(-gate)) * linear(h, f"{b}.ffn_up"), f"{b}.ffn_down")
    output = t.get("output.weight", t["token_embd.weight"])  # tied: the embedding
    return norm(x, t["output_norm.weight"]) @ output.T


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("tokenizer")
    gguf_models.bpe_tokenizer(directory)  # 400 byte-level BPE tokens
    return directory


@pytest.mark.gguf
@pytest.mark.parametrize(("tied", "compensated"), [(False, False), (True, True)])
def test_a_pruned_qwen2_is_a_deci_gguf_that_computes_transformers_logits(
    tokenizer_dir: Path, tmp_path: Path, tied: bool, compensated: bool
) -> None:
    """The file read back with gguf-py: deci's per-layer widths, the q/k/v biases (the query's
    and key's permuted with their rows), no output bias; a compensated cut's down-projection
    bias too (deci reads ffn_down.bias; transformers' Qwen2 cannot hold it). llama.cpp's graph
    on its tensors gives transformers' logits of the pruned model."""
    gguf = pytest.importorskip("gguf")
    from geospec.prune.gguf_export import gguf_widths, write_gguf

    model = qwen2(vocab=gguf_models.VOCAB, tied=tied)
    orders, means = orders_and_means(model)
    sites = sites_of(model)
    tokens = [int(i) for i in ids(gguf_models.VOCAB)[0]]
    biases = [  # what the compensated cut adds to each down projection
        compensation_bias(s.ffn, kept_neurons(o, w), m)
        for s, o, w, m in zip(sites, orders, WIDTHS, means, strict=True)
    ]
    with torch.no_grad(), pruned(sites, orders, WIDTHS, means if compensated else None):
        expected = model(input_ids=torch.tensor([tokens])).logits[0].double().numpy()
        written = write_gguf(model, tmp_path / "q.gguf", "f32", tokenizer=tokenizer_dir)
        parameters = sum(p.numel() for p in model.parameters())  # the cut, biases included
    assert written.widths == WIDTHS and gguf_widths(written.path) == WIDTHS
    reader = gguf.GGUFReader(str(written.path))
    assert reader.fields["general.architecture"].contents() == "deci"
    tensors = {t.name: np.asarray(t.data) for t in reader.tensors}
    assert written.parameters == parameters == sum(int(t.n_elements) for t in reader.tensors)
    assert ("output.weight" in tensors) != tied
    for i, layer in enumerate(model.model.layers):
        assert f"blk.{i}.attn_output.bias" not in tensors
        np.testing.assert_array_equal(
            tensors[f"blk.{i}.attn_v.bias"], layer.self_attn.v_proj.bias.detach().numpy()
        )
        # head h's bias halves interleave: entry j of half k goes to 2 j + k (head size 8)
        q = layer.self_attn.q_proj.bias.detach().numpy().reshape(HEADS, 2, 4)
        np.testing.assert_array_equal(tensors[f"blk.{i}.attn_q.bias"], q.swapaxes(1, 2).ravel())
        if compensated:
            np.testing.assert_allclose(tensors[f"blk.{i}.ffn_down.bias"], biases[i], rtol=1e-6)
        else:
            assert f"blk.{i}.ffn_down.bias" not in tensors
    got = deci_logits(written.path, tokens)
    np.testing.assert_allclose(got, expected, atol=2e-4, rtol=1e-4)


@pytest.mark.gguf
@pytest.mark.parametrize("dtype", ["f32", "q8_0"])
def test_a_repaired_qwen2_is_written_from_its_true_width_directory_with_its_down_bias(
    tokenizer_dir: Path, tmp_path: Path, dtype: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The least-squares re-fit with its intercept, exported at the true widths (the directory
    every unit export, What to ship and select.shipped write the GGUF file from): the file holds
    each cut layer's intercept as ffn_down.bias in f32, equal to the in-memory repair's; in f32
    llama.cpp's graph on the file gives the in-memory model's logits, and in Q8_0 (the type a
    Qwen2 GGUF source has) the model geospec scores as shipped (the file de-quantized into
    load_pruned's model) gives the graph's logits on the same file."""
    import sys

    gguf = pytest.importorskip("gguf")
    from geospec.prune.gguf_export import write_gguf
    from geospec.prune.gguf_weights import shipped_model

    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # gguf-py writes Q8_0 on every machine
    model = qwen2(vocab=gguf_models.VOCAB)
    orders, _ = orders_and_means(model)
    sites = sites_of(model)
    calibration = ids(gguf_models.VOCAB, seed=1)
    moments = calibration_moments(model, sites, [(calibration, calibration)])
    refits = one_pass_refits(sites, moments, orders, WIDTHS, damping=0.01)
    assert refits[1] is None  # the middle layer keeps every neuron: nothing to re-fit
    tokens = [int(i) for i in ids(gguf_models.VOCAB)[0]]
    with torch.no_grad(), pruned(sites, orders, WIDTHS, refits=refits):
        expected = model(input_ids=torch.tensor([tokens])).logits[0].double().numpy()
        export_pruned(model, sites, WIDTHS, tmp_path / "model")
    written = write_gguf(tmp_path / "model", tmp_path / "q.gguf", dtype, tokenizer=tokenizer_dir)
    tensors = {t.name: t for t in gguf.GGUFReader(str(written.path)).tensors}
    for layer, found in enumerate(refits):
        stored = tensors[f"blk.{layer}.ffn_down.bias"]
        assert stored.tensor_type == gguf.GGMLQuantizationType.F32
        bias = None if found is None else found.bias
        intercept = np.zeros(D_MODEL) if bias is None else bias.float().numpy()
        np.testing.assert_allclose(stored.data, intercept, rtol=1e-6, atol=1e-7)
    assert "blk.0.ffn_gate.bias" not in tensors and "blk.0.ffn_up.bias" not in tensors
    got = deci_logits(written.path, tokens)
    if dtype == "f32":
        np.testing.assert_allclose(got, expected, atol=2e-4, rtol=1e-4)
    else:
        assert tensors["blk.0.ffn_down.weight"].tensor_type == gguf.GGMLQuantizationType.Q8_0
        shipped = shipped_model(tmp_path / "model", written.path)
        assert shipped.model.layers[0].mlp.down_proj.bias is not None
        with torch.no_grad():
            scored = shipped(input_ids=torch.tensor([tokens])).logits[0].double().numpy()
        # deci_logits de-quantizes the file with gguf-py too: the same weights, another graph
        np.testing.assert_allclose(scored, got, atol=2e-4, rtol=1e-4)
        assert np.abs(scored - expected).max() > 1e-4  # the quantization shows: not the float


# -- the prune end to end, and bad input ---------------------------------------------------------


def bpe_checkpoint(directory: Path, vocab: int = gguf_models.VOCAB) -> Path:
    """The tiny Qwen2 with the 400-token byte-level BPE tokenizer, saved as a Hugging Face
    checkpoint; ``vocab``: the model's embeddings."""
    gguf_models.bpe_tokenizer(directory)
    qwen2(vocab=vocab).save_pretrained(directory)
    return directory


def prune_spec(directory: Path, **prune: object) -> Path:
    import gzip

    from geospec.data import __file__ as data_init

    with gzip.open(Path(data_init).parent / "austen.txt.gz", "rt", encoding="utf-8") as file:
        text = file.read()[200_000:260_000]  # beyond what the tokenizer was trained on
    documents = [json.dumps({"text": text[i : i + 1000]}) for i in range(0, len(text), 1000)]
    (directory / "docs.jsonl").write_text("\n".join(documents))
    if not (directory / "model").exists():
        bpe_checkpoint(directory / "model")
    arms = [
        {"name": "uniform", "schedule": {"kind": "uniform"}},
        {"name": "flap", "schedule": {"kind": "flap"}, "importance": {"kind": "fluctuation"}},
        {"name": "owl", "schedule": {"kind": "owl"}, "importance": {"kind": "wanda_sp"}},
        {"name": "shift", "schedule": {"kind": "geometric", "profile": "shift/spherical"}},
        {"name": "protect", "schedule": {"kind": "protect", "first": 1}},
        {"name": "greedy", "schedule": {"kind": "greedy", "step": 2}},
    ]
    # the quick start's shape: [model] is read from the checkpoint, the tokenizer is its own
    spec = {
        "name": "qwen2",
        "out": str(directory / "run"),
        "model": {"seq_len": 16, "multiple_of": 8},
        "data": {"files": ["docs.jsonl"]},
        "reference": {"checkpoint": "model"},
        "probe": {"tokens": 64},
        "prune": {"keep": 0.5, "calibration": {"windows": 4, "seeds": [0]},
                  "eval": {"corpora": ["docs.jsonl"], "windows": 4}, "arms": arms} | prune,
    }  # fmt: skip
    path = directory / "spec.toml"
    path.write_text(tomlkit.dumps(spec))
    return path


def eval_loss_here(directory: Path, model: torch.nn.Module) -> float:
    """``model``'s loss on the first 4 validation windows of the spec's docs.jsonl, computed by
    plain transformers and cross-entropy: what the prune records as its eval loss."""
    from geospec.engine.batches import validation_windows, window_tensors
    from geospec.engine.token_data import prepare_data
    from geospec.spec.loading import load_spec

    data = prepare_data(load_spec(directory / "spec.toml").data, directory / "cache", directory)
    tokens = data.val[:-1] if int(data.val[-1]) == data.eot_id else data.val
    x, y = window_tensors(tokens, validation_windows(len(tokens), 16, 4 * 16), 16)
    with torch.no_grad():
        logits = model(input_ids=x).logits
    return float(torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), y.flatten()))


def test_geospec_prune_prunes_a_qwen2_checkpoint_and_its_models_score_what_it_recorded(
    tmp_path: Path,
) -> None:
    """The probe, the calibration statistics, every arm's importance and allocation (OWL's over
    the biased q/k/v inputs too), the cut and the export, on a Qwen2 read from its config.json;
    each exported model, read by load_pruned, has the loss the prune recorded, computed here by
    plain transformers and cross-entropy on the first 4 validation windows of docs.jsonl."""
    result = CliRunner().invoke(cli, ["prune", str(prune_spec(tmp_path))])
    assert result.exit_code == 0, result.output + repr(result.exception)
    arms = json.loads((tmp_path / "run" / "prune.json").read_text())["budgets"][0]["arms"]
    assert set(arms) == {"uniform", "flap", "owl", "shift", "protect", "greedy"}
    assert arms["protect"]["widths"]["0"] == [64, 16, 16]  # layer 0 whole
    for arm, record in arms.items():
        model = geospec.load_pruned(
            tmp_path / "run" / "prune" / "keep-0.5" / arm / "seed-0" / "model"
        )
        assert type(model) is hf.Qwen2ForCausalLM
        assert model.model.layers[0].self_attn.q_proj.bias is not None
        widths = [layer.mlp.down_proj.in_features for layer in model.model.layers]
        assert widths == record["widths"]["0"] and sum(widths) == 3 * 32
        loss = eval_loss_here(tmp_path, model)
        assert loss == pytest.approx(record["loss"]["docs.jsonl"]["0"], rel=1e-5)


def test_a_healed_qwen2_unit_exports_its_healed_model_with_its_attention_biases(
    tmp_path: Path,
) -> None:
    """heal.steps on a Qwen2 prune: each unit is imported with its q/k/v biases, trained in
    geospec's engine (the biases train too) and written back into the Qwen2 it came from; read
    by load_pruned, the unit's model computes the engine's healed logits."""
    from geospec.engine.checkpoint import load_model

    arms = [{"name": "uniform", "schedule": {"kind": "uniform"}}]
    spec = prune_spec(tmp_path, arms=arms, heal={"steps": 2, "lr": 0.01, "batch_size": 2})
    result = CliRunner().invoke(cli, ["prune", str(spec)])
    assert result.exit_code == 0, result.output + repr(result.exception)
    unit = tmp_path / "run" / "prune" / "keep-0.5" / "uniform" / "seed-0"
    healed = load_model(unit / "heal")
    assert healed.config.qkv_bias and not healed.config.ffn_out_bias
    exported = geospec.load_pruned(unit / "model")
    assert type(exported) is hf.Qwen2ForCausalLM
    tokens = ids(gguf_models.VOCAB)
    with torch.no_grad():
        expected, _ = healed(tokens)
        got = exported(input_ids=tokens).logits
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    pruned_bias = qwen2(vocab=gguf_models.VOCAB).model.layers[0].self_attn.q_proj.bias
    assert (exported.model.layers[0].self_attn.q_proj.bias - pruned_bias).abs().max() > 0
    record = json.loads((tmp_path / "run" / "prune.json").read_text())
    uniform = record["budgets"][0]["arms"]["uniform"]
    assert uniform["healed_loss"]["docs.jsonl"]["0"] != uniform["loss"]["docs.jsonl"]["0"]


@pytest.fixture(scope="module")
def healed_ends(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Qwen2 prune at keep 3/4 whose one arm keeps its first and last layers whole and
    re-fits the middle one with an intercept, each unit healed for 2 steps ([prune.heal]): the
    unit's directory."""
    directory = tmp_path_factory.mktemp("ends")
    arms = [{"name": "ends", "schedule": {"kind": "protect", "first": 1, "last": 1},
             "repair": "lstsq", "lstsq": {"intercept": True}}]  # fmt: skip
    spec = prune_spec(directory, arms=arms, baseline="ends", keep=0.75,
                      heal={"steps": 2, "lr": 0.01, "batch_size": 2})  # fmt: skip
    result = CliRunner().invoke(cli, ["prune", str(spec)])
    assert result.exit_code == 0, result.output + repr(result.exception)
    return directory / "run" / "prune" / "keep-0.75" / "ends" / "seed-0"


def test_a_refit_with_its_intercept_heals_where_layers_are_kept_whole(healed_ends: Path) -> None:
    """Issue 54: the prune used to stop at the unit's import into geospec's engine ("some of its
    FFN output projections have biases and some do not"). The unit's pruned model, made again
    from its records as a finished unit's export makes it, has a down bias on every layer (zero
    on the two kept whole), and geospec's model imported from it computes its transformers
    logits. Healing moved every down projection's weight and bias, the zero ones too, and the
    unit's model/ (the healed model at its true widths, read by load_pruned) computes the
    engine's healed logits."""
    from geospec.engine.checkpoint import load_model
    from geospec.prune.cut import cut_to, load_cut
    from geospec.prune.repair import load_refits
    from geospec.rundir.layout import CUT_FILE, HEAL_DIR, REPAIR_FILE, UNIT_MODEL_DIR

    record = json.loads((healed_ends / "result.json").read_text())
    assert record["widths"] == [FULL, 16, FULL]
    assert record["healed_loss"]["docs.jsonl"] != record["loss"]["docs.jsonl"]
    cut, _ = load_cut(healed_ends / CUT_FILE, record["key"], [FULL] * 3)
    refits, _ = load_refits(healed_ends / REPAIR_FILE, record["key"])
    assert cut is not None and refits is not None and refits[0] is None and refits[2] is None
    model = hf.Qwen2ForCausalLM.from_pretrained(healed_ends.parents[4] / "model").eval()
    sites = sites_of(model)
    tokens = ids(gguf_models.VOCAB)
    with torch.no_grad(), cut_to(sites, cut._replace(refits=refits), record["widths"]):
        biases = [down(site).bias.clone() for site in sites]
        assert not biases[0].any() and not biases[2].any() and biases[1].any()
        expected = model(input_ids=tokens).logits
        imported = import_llama(model, 16)
        got, _ = imported(tokens)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    healed = load_model(healed_ends / HEAL_DIR)
    assert healed.config.ffn_out_bias and healed.config.ffn_widths == record["widths"]
    before, after = imported.state_dict(), healed.state_dict()
    for layer in range(3):
        for name in ("weight", "bias"):
            key = f"blocks.{layer}.ffn.proj.{name}"
            assert not torch.equal(after[key].cpu(), before[key]), key
    exported = geospec.load_pruned(healed_ends / UNIT_MODEL_DIR)
    assert all(layer.mlp.down_proj.bias is not None for layer in exported.model.layers)
    with torch.no_grad():
        expected, _ = healed(tokens)
        got = exported(input_ids=tokens).logits
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.gguf
def test_a_healed_refit_with_layers_kept_whole_is_a_deci_gguf_of_the_healed_model(
    healed_ends: Path, tokenizer_dir: Path, tmp_path: Path
) -> None:
    """The healed unit of the test above written as llama.cpp's deci GGUF from its model/ (as
    geospec export and What to ship write it): every layer's ffn_down.bias is the healed
    model's, and llama.cpp's graph on the file gives load_pruned's logits."""
    gguf = pytest.importorskip("gguf")
    from geospec.prune.gguf_export import write_gguf

    model = geospec.load_pruned(healed_ends / "model")
    written = write_gguf(healed_ends / "model", tmp_path / "h.gguf", "f32", tokenizer=tokenizer_dir)
    tensors = {t.name: np.asarray(t.data) for t in gguf.GGUFReader(str(written.path)).tensors}
    for i, layer in enumerate(model.model.layers):
        bias = layer.mlp.down_proj.bias.detach().numpy()
        np.testing.assert_allclose(tensors[f"blk.{i}.ffn_down.bias"], bias, rtol=1e-6)
    tokens = [int(i) for i in ids(gguf_models.VOCAB)[0]]
    with torch.no_grad():
        expected = model(input_ids=torch.tensor([tokens])).logits[0].double().numpy()
    np.testing.assert_allclose(deci_logits(written.path, tokens), expected, atol=2e-4, rtol=1e-4)


def test_a_compensated_qwen2_prune_exports_its_models_with_their_bias(tmp_path: Path) -> None:
    """Mean compensation on a Qwen2 (whose transformers MLP has no bias option) is valid with
    its models exported: the exported model, read by load_pruned with each down projection's
    bias, has the loss the prune recorded (computed here by transformers)."""
    arms = [
        {"name": "uniform", "schedule": {"kind": "uniform"}},
        {"name": "flap", "schedule": {"kind": "flap"}, "repair": "mean"},
    ]
    spec = prune_spec(tmp_path, arms=arms)
    result = CliRunner().invoke(cli, ["validate", str(spec)])
    assert result.exit_code == 0 and "warning:" not in result.output, result.output
    result = CliRunner().invoke(cli, ["prune", str(spec)])
    assert result.exit_code == 0, result.output + repr(result.exception)
    record = json.loads((tmp_path / "run" / "prune.json").read_text())["budgets"][0]["arms"]
    unit = tmp_path / "run" / "prune" / "keep-0.5" / "flap" / "seed-0"
    model = geospec.load_pruned(unit / "model")
    assert all(layer.mlp.down_proj.bias is not None for layer in model.model.layers)
    assert any(layer.mlp.down_proj.bias.abs().max() > 0 for layer in model.model.layers)
    loss = eval_loss_here(tmp_path, model)
    assert loss == pytest.approx(record["flap"]["loss"]["docs.jsonl"]["0"], rel=1e-5)


def test_a_qwen2_whose_ffn_the_cut_does_not_know_is_one_line(tmp_path: Path) -> None:
    """Qwen2-MoE: every layer's FFN is a mixture of experts. validate says so in one line, exit
    status 2: first that its shape is not read, and with [model] given in full, that the prune
    cannot cut it."""
    config = hf.Qwen2MoeConfig(**TINY | {"vocab_size": gguf_models.VOCAB}, num_experts=4,
                               num_experts_per_tok=2, moe_intermediate_size=16,
                               shared_expert_intermediate_size=16)  # fmt: skip
    spec = prune_spec(tmp_path, arms=[{"name": "uniform", "schedule": {"kind": "uniform"}}])
    hf.Qwen2MoeForCausalLM(config).save_pretrained(tmp_path / "model")
    result = CliRunner().invoke(cli, ["validate", str(spec)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "model_type 'qwen2_moe' is not one whose shape geospec reads" in result.output
    full = {"n_layers": 2, "d_model": 32, "n_heads": 4, "n_kv_heads": 2, "ffn_width": 16,
            "activation": "swiglu", "norm": "rmsnorm", "positions": "rope"}  # fmt: skip
    data = tomlkit.parse(spec.read_text())
    data["model"] = dict(data["model"]) | full
    spec.write_text(tomlkit.dumps(data))
    result = CliRunner().invoke(cli, ["validate", str(spec)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    line = next(x for x in result.output.splitlines() if "cannot cut" in x)
    assert "qwen2_moe" in line and "a mixture of 4 experts" in line


def test_a_tokenizer_of_another_vocabulary_is_one_line(tmp_path: Path) -> None:
    """The checkpoint has 300 embeddings, its tokenizer 400 ids: validate refuses it, exit 2."""
    bpe_checkpoint(tmp_path / "model", vocab=300)
    result = CliRunner().invoke(cli, ["validate", str(prune_spec(tmp_path))])
    assert result.exit_code == 2 and "Traceback" not in result.output
    line = next(x for x in result.output.splitlines() if "vocab" in x.lower())
    assert "400" in line and "300" in line and "data.tokenizer" in line


# -- a Qwen2 GGUF as the reference (as Qwen2.5-Coder's files are) ------------------------------


@pytest.fixture(scope="module")
def qwen2_gguf(tokenizer_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Qwen2 (400 tokens) as llama.cpp's converter writes it, Q8_0 matrices."""
    pytest.importorskip("gguf")
    path = tmp_path_factory.mktemp("gguf") / "qwen2.gguf"
    return gguf_models.qwen2_gguf(path, qwen2(vocab=gguf_models.VOCAB), tokenizer_dir, q8_0=True)


@pytest.mark.gguf
def test_the_shape_of_a_qwen2_gguf_is_read_from_its_metadata(qwen2_gguf: Path) -> None:
    """[model] from the qwen2.* keys equals the model transformers' GGUF loader builds."""
    from geospec.spec.checkpoint_shape import shape_from_gguf

    model = hf.AutoModelForCausalLM.from_pretrained(
        qwen2_gguf.parent, gguf_file=qwen2_gguf.name
    ).eval()
    assert isinstance(model, hf.Qwen2ForCausalLM)
    shape = shape_from_gguf(qwen2_gguf)
    assert shape is not None
    attention = model.model.layers[0].self_attn
    assert shape.values == {
        "n_layers": len(model.model.layers),
        "d_model": model.model.embed_tokens.weight.shape[1],
        "n_heads": attention.q_proj.out_features // attention.head_dim,
        "n_kv_heads": attention.k_proj.out_features // attention.head_dim,
        "ffn_width": model.model.layers[0].mlp.up_proj.out_features,
        "activation": "swiglu",
        "vocab_size": model.model.embed_tokens.weight.shape[0],
        "norm": "rmsnorm",
        "positions": "rope",
        "rope_theta": model.config.rope_parameters["rope_theta"],
        "tie_embeddings": False,
        "bias": model.model.layers[0].mlp.up_proj.bias is not None,
    }


@pytest.mark.gguf
def test_an_incomplete_or_doubled_gguf_assembly_is_one_line(
    qwen2_gguf: Path, tmp_path: Path
) -> None:
    """The file's size against its tensors' extent (each type's block size as gguf-py lists it):
    a file missing its last part, or with a part twice, is one line naming it, exit status 2,
    before anything loads it."""
    gguf = pytest.importorskip("gguf")
    from geospec.spec.checkpoint_shape import GGML_BLOCKS, gguf_data_problem

    for kind, block in GGML_BLOCKS.items():
        assert gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(kind)] == block
    assert gguf_data_problem(qwen2_gguf) is None
    data = qwen2_gguf.read_bytes()
    spec = prune_spec(tmp_path)
    spec.write_text(spec.read_text().replace('checkpoint = "model"', 'checkpoint = "q.gguf"'))
    for broken, words in [
        (data[: len(data) * 5 // 6], "incomplete"),
        (data + data[-len(data) // 6 :], "extra data"),
    ]:
        (tmp_path / "q.gguf").write_bytes(broken)
        result = CliRunner().invoke(cli, ["validate", str(spec)])
        assert result.exit_code == 2 and "Traceback" not in result.output
        (line,) = [x for x in result.output.splitlines() if "reference.checkpoint" in x]
        assert str(tmp_path / "q.gguf") in line and words in line and "assemble it again" in line
    result = CliRunner().invoke(cli, ["prune", str(spec)])  # checked before anything loads
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "extra data" in result.output and not (tmp_path / "run").exists()
    for broken in (data[:100], data[1000:]):  # cut inside the header; its first part lost
        (tmp_path / "q.gguf").write_bytes(broken)
        result = CliRunner().invoke(cli, ["validate", str(spec)])
        assert result.exit_code == 2 and "Traceback" not in result.output
        (line,) = [x for x in result.output.splitlines() if "reference.checkpoint" in x]
        assert "is not a readable GGUF file" in line and "assemble it again" in line
        assert "give [model] in full" not in result.output  # [model] would not help


@pytest.mark.gguf
def test_a_qwen2_gguf_is_pruned_and_exported_as_deci_with_its_own_tokenizer(
    qwen2_gguf: Path, tmp_path: Path
) -> None:
    """geospec prune on the GGUF file (shape, tokenizer and weights from it), then geospec
    export --format gguf: the deci file carries the source's qwen2 tokenizer fields as they are,
    and llama.cpp's graph on it gives the logits of the exported model load_pruned reads."""
    import shutil

    gguf = pytest.importorskip("gguf")
    shutil.copy(qwen2_gguf, tmp_path / "q.gguf")
    spec = prune_spec(tmp_path)
    data = tomlkit.parse(spec.read_text())
    data["reference"]["checkpoint"] = "q.gguf"  # type: ignore[index]
    data["prune"]["arms"] = data["prune"]["arms"][:2]  # type: ignore[index]
    spec.write_text(tomlkit.dumps(data))
    result = CliRunner().invoke(cli, ["prune", str(spec)])
    assert result.exit_code == 0, result.output + repr(result.exception)
    unit = tmp_path / "run" / "prune" / "keep-0.5" / "flap" / "seed-0"
    out = tmp_path / "flap.gguf"
    args = ["export", str(unit), "--to", str(out), "--format", "gguf", "--dtype", "f32"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output + repr(result.exception)
    source = gguf.GGUFReader(str(qwen2_gguf)).fields
    written = gguf.GGUFReader(str(out)).fields
    assert written["general.architecture"].contents() == "deci"
    assert written["tokenizer.ggml.pre"].contents() == "qwen2"
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.eos_token_id"):
        assert written[key].contents() == source[key].contents()
    model = geospec.load_pruned(unit / "model")
    widths = [layer.mlp.down_proj.in_features for layer in model.model.layers]
    assert written["deci.feed_forward_length"].contents() == widths
    tokens = [int(i) for i in ids(gguf_models.VOCAB)[0]]
    with torch.no_grad():
        expected = model(input_ids=torch.tensor([tokens])).logits[0].double().numpy()
    np.testing.assert_allclose(deci_logits(out, tokens), expected, atol=2e-4, rtol=1e-4)


@pytest.mark.gguf
def test_a_qwen2_tokenizer_json_is_written_as_llamacpps_qwen2_pre_tokenizer(
    qwen2_gguf: Path, tmp_path: Path
) -> None:
    """A Qwen2 checkpoint's tokenizer.json (transformers' Qwen2Tokenizer: its split regex, then
    byte-level BPE) is llama.cpp's gpt2 model with the qwen2 pre-tokenizer, every token and merge
    of the GGUF it came from; another split regex is refused in one line."""
    gguf = pytest.importorskip("gguf")
    from geospec.prune.gguf_export import write_gguf

    tokenizer = hf.AutoTokenizer.from_pretrained(qwen2_gguf.parent, gguf_file=qwen2_gguf.name)
    assert isinstance(tokenizer, hf.Qwen2Tokenizer)
    tokenizer.save_pretrained(tmp_path / "tokenizer")
    model = qwen2(vocab=gguf_models.VOCAB)
    out = write_gguf(model, tmp_path / "q.gguf", "f32", tokenizer=tmp_path / "tokenizer").path
    source = gguf.GGUFReader(str(qwen2_gguf)).fields
    written = gguf.GGUFReader(str(out)).fields
    assert written["tokenizer.ggml.pre"].contents() == "qwen2"
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
        assert written[key].contents() == source[key].contents()
    file = tmp_path / "tokenizer" / "tokenizer.json"
    spec = json.loads(file.read_text())
    spec["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = r"\p{L}+|\s+"
    file.write_text(json.dumps(spec))
    with pytest.raises(UsageError, match="not a byte-level BPE tokenizer of a kind"):
        write_gguf(model, tmp_path / "x.gguf", "f32", tokenizer=tmp_path / "tokenizer")


# -- the real Qwen2.5-Coder-0.5B-Instruct GGUF (nox -s gguf assembles it) --------------------


def qwen_coder_gguf() -> Path:
    pytest.importorskip("gguf", reason="the gguf extra: pip install 'geospec[gguf]'")
    path = os.environ.get("GEOSPEC_TEST_QWEN_GGUF")
    if not path:
        pytest.skip("GEOSPEC_TEST_QWEN_GGUF is not set: nox -s gguf assembles Qwen2.5-Coder-0.5B")
    assert Path(path).is_file(), path
    return Path(path)


@pytest.mark.gguf
def test_qwen2_5_coder_0_5b_is_read_from_its_gguf_header(tmp_path: Path) -> None:
    """The assembled file holds its own tensors, and [model] is filled from its qwen2.* keys:
    24 layers, d_model 896, 4,864 FFN neurons, 14 / 2 heads, an untied 151,936-token head."""
    shape = header_shape(qwen_coder_gguf())
    assert (shape["n_layers"], shape["d_model"], shape["ffn_width"], shape["n_heads"]) == (
        24, 896, 4864, 14,
    )  # fmt: skip
    assert shape["bias"] is False


def header_shape(path: Path) -> dict[str, Any]:
    """[model] as read from a real Qwen2.5-Coder GGUF's header (its data checked complete):
    both sizes have 2 key-value heads and an untied 151,936-token head."""
    from geospec.spec.checkpoint_shape import gguf_data_problem, shape_from_gguf

    assert gguf_data_problem(path) is None
    shape = shape_from_gguf(path)
    assert shape is not None
    assert shape.values["n_kv_heads"] == 2 and shape.values["vocab_size"] == 151_936
    assert shape.values["tie_embeddings"] is False
    return dict(shape.values)


@pytest.mark.gguf
def test_qwen2_5_coder_1_5b_is_read_from_its_gguf_header() -> None:
    """The 1.5B model (22 part wheels, assembled by nox -s gguf; GEOSPEC_TEST_QWEN15_GGUF): 28
    layers, d_model 1536, 8,960 FFN neurons, 12 / 2 heads, an untied 151,936-token head, as
    Qwen's config.json for Qwen2.5-Coder-1.5B-Instruct says."""
    pytest.importorskip("gguf", reason="the gguf extra: pip install 'geospec[gguf]'")
    found = os.environ.get("GEOSPEC_TEST_QWEN15_GGUF")
    if not found:
        pytest.skip("GEOSPEC_TEST_QWEN15_GGUF is not set: nox -s gguf assembles it")
    shape = header_shape(Path(found))
    assert (shape["n_layers"], shape["d_model"], shape["ffn_width"], shape["n_heads"]) == (
        28, 1536, 8960, 12,
    )  # fmt: skip


@pytest.mark.gguf
@pytest.mark.slow
def test_qwen2_5_coder_0_5b_loads_as_a_qwen2_that_geospec_cuts_heals_and_writes() -> None:
    """transformers' GGUF loader builds a Qwen2ForCausalLM of 630M parameters with q/k/v biases
    and no o_proj bias; every FFN is a gate/up/down layout the cut knows, healing can import it
    and the GGUF writer maps it (47 s and 4.8 GB to load in float32 on 2 cores)."""
    from geospec.measure.cut import ffn_layout
    from geospec.prune.gguf_export import _check_family

    path = qwen_coder_gguf()
    model = hf.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name).eval()
    assert isinstance(model, hf.Qwen2ForCausalLM)
    assert 625e6 < sum(p.numel() for p in model.parameters()) < 635e6
    attention = model.model.layers[0].self_attn
    assert attention.q_proj.bias is not None and attention.o_proj.bias is None
    assert all(
        ffn_layout(layer.mlp).inputs == ("gate_proj", "up_proj") for layer in model.model.layers
    )
    assert import_problem(model) is None
    _check_family(model)


@pytest.mark.parametrize("intercept", [True, False])
def test_a_qwen2_repair_exports_and_scores_what_it_recorded(
    tmp_path: Path, intercept: bool
) -> None:
    """The least-squares repair on a Qwen2, with its intercept (a bias on each cut layer's down
    projection, which the true-width export carries and load_pruned gives back) or without (the
    kept columns alone: no bias): the exported model scores the recorded loss."""
    arms = [{"name": "uniform", "schedule": {"kind": "uniform"}, "repair": "lstsq"}]
    spec = prune_spec(tmp_path, arms=arms, lstsq={"intercept": intercept})
    result = CliRunner().invoke(cli, ["prune", str(spec)])
    assert result.exit_code == 0, result.output + repr(result.exception)
    record = json.loads((tmp_path / "run" / "prune.json").read_text())
    unit = tmp_path / "run" / "prune" / "keep-0.5" / "uniform" / "seed-0"
    model = geospec.load_pruned(unit / "model")
    biases = [layer.mlp.down_proj.bias for layer in model.model.layers]
    assert all((bias is not None) == intercept for bias in biases)
    assert (unit / "repair.safetensors").is_file()
    arm = record["budgets"][0]["arms"]["uniform"]
    assert arm["repair"] == "lstsq" and arm["lstsq"]["intercept"] is intercept
    loss = eval_loss_here(tmp_path, model)
    assert loss == pytest.approx(arm["loss"]["docs.jsonl"]["0"], rel=1e-5)


def test_a_recommended_qwen2_refit_with_an_intercept_is_measured_as_shipped(
    tmp_path: Path,
) -> None:
    """With prune.export = false What to ship still writes the recommended model (its re-fit's
    intercept included) into a temporary directory and measures its files: the bytes of its
    true-width safetensors, which hold every down projection's bias."""
    arms = [
        {"name": "uniform", "schedule": {"kind": "uniform"}},
        {"name": "protect", "schedule": {"kind": "protect", "first": 1}},
    ]
    spec = prune_spec(tmp_path, arms=arms, export=False, repair="lstsq",
                      select={"windows": 2, "runtime": False})  # fmt: skip
    result = CliRunner().invoke(cli, ["prune", str(spec)])
    assert result.exit_code == 0, result.output + repr(result.exception)
    record = json.loads((tmp_path / "run" / "prune.json").read_text())
    shipped = record["budgets"][0]["recommended"]["shipped"]
    assert "unexportable" not in shipped
    # float32 weights: 4 bytes a parameter, the biases among them (plus the file's header)
    widths = record["budgets"][0]["arms"][shipped["arm"]]["widths"]["0"]
    parameters = sum(p.numel() for p in qwen2(vocab=gguf_models.VOCAB).parameters())
    cut = sum(64 - w for w in widths) * 3 * D_MODEL
    assert 4 * (parameters - cut + 3 * D_MODEL) < shipped["safetensors_bytes"]
    assert shipped["safetensors_bytes"] < 4 * (parameters - cut + 3 * D_MODEL) + 20_000
    result = CliRunner().invoke(cli, ["prune", str(spec)])  # the record is reused, not redone
    assert result.exit_code == 0 and "measuring what the recommended" not in result.output
