"""GGUF exports read by an unmodified llama.cpp (llama-cpp-python, built from its source
distribution by `nox -s llamacpp`): llama.cpp builds each layer's FFN at the width the file
gives, and its next-token log-probabilities equal transformers' on the same model to the
tolerance of the weights' type. Skipped where llama_cpp is not installed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import gguf_models
import numpy as np
import pytest
import torch

pytestmark = [pytest.mark.torch, pytest.mark.llamacpp, pytest.mark.usefixtures("one_torch_thread")]
llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python: nox -s llamacpp builds it")
pytest.importorskip("gguf", reason="the gguf extra: pip install 'geospec[gguf]'")

from geospec.prune.gguf_export import write_gguf  # noqa: E402

#: llama.cpp's float32 type, for the KV cache (its default f16 cache would round keys and
#: values: the comparison would measure the cache, not the file).
GGML_F32 = 0


def load(path: Path, n_ctx: int = 64) -> object:
    return llama_cpp.Llama(
        model_path=str(path),
        n_ctx=n_ctx,
        n_batch=n_ctx,
        n_threads=2,
        logits_all=True,
        type_k=GGML_F32,
        type_v=GGML_F32,
        flash_attn=False,
        verbose=False,
    )


def llamacpp_log_probs(llm: object, ids: list[int]) -> np.ndarray:
    llm.reset()  # type: ignore[attr-defined]
    llm.eval(ids)  # type: ignore[attr-defined]
    scores = np.asarray(llm.scores[: len(ids)], dtype=np.float64)  # type: ignore[attr-defined]
    return scores - np.logaddexp.reduce(scores, axis=-1, keepdims=True)


def torch_log_probs(model: torch.nn.Module, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].double()  # type: ignore[operator]
    return torch.log_softmax(logits, dim=-1).numpy()


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("tokenizer")
    gguf_models.bpe_tokenizer(directory)
    return directory


def eos_of(tokenizer_dir: Path) -> int:
    return int(json.loads((tokenizer_dir / "tokenizer.json").read_text())["added_tokens"][0]["id"])


def rounded(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """The model with its matrices rounded to ``dtype`` (norms kept), computing in float32: what
    an f16 file holds."""
    import copy

    copied = copy.deepcopy(model)
    with torch.no_grad():
        for parameter in copied.parameters():
            if parameter.ndim == 2:
                parameter.copy_(parameter.to(dtype).float())
    return copied


@pytest.mark.parametrize("tied", [False, True])
def test_llamacpp_computes_the_pruned_tiny_llama_to_f32_precision(
    tokenizer_dir: Path, tmp_path: Path, tied: bool
) -> None:
    from transformers import AutoTokenizer

    model = gguf_models.llama(eos_of(tokenizer_dir), tied=tied)
    path = write_gguf(model, tmp_path / "m.gguf", "f32", tokenizer=tokenizer_dir).path
    llm = load(path)
    hf_tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    ids = hf_tokenizer(gguf_models.TEXT)["input_ids"]
    # llama.cpp tokenizes the text as the tokenizer.json does (vocabulary and merges written)
    assert llm.tokenize(gguf_models.TEXT.encode(), add_bos=False, special=False) == ids  # type: ignore[attr-defined]
    ours = llamacpp_log_probs(llm, ids)
    theirs = torch_log_probs(model, ids)
    assert np.abs(ours - theirs).max() < 1e-4
    assert (ours.argmax(-1) == theirs.argmax(-1)).all()
    # llama.cpp built the FFNs at the file's widths: its parameter count is the true one
    n_params = llama_cpp.llama_model_n_params(llm.model)  # type: ignore[attr-defined]
    assert n_params == sum(p.numel() for p in model.parameters())


def test_llamacpp_computes_an_f16_file_as_transformers_computes_its_rounded_weights(
    tokenizer_dir: Path, tmp_path: Path
) -> None:
    """f16 weights: the reference is the model with its matrices rounded to f16; llama.cpp also
    rounds the activations entering each f16 matrix product, so the tolerance is f16's."""
    model = gguf_models.llama(eos_of(tokenizer_dir))
    path = write_gguf(model, tmp_path / "h.gguf", "f16", tokenizer=tokenizer_dir).path
    ids = list(range(3, 40))
    ours = llamacpp_log_probs(load(path), ids)
    theirs = torch_log_probs(rounded(model, torch.float16), ids)
    assert np.abs(ours - theirs).max() < 2e-3


def test_llamacpp_reads_a_q8_0_file(tokenizer_dir: Path, tmp_path: Path) -> None:
    """Q8_0: the reference is transformers on gguf-py's own de-quantised weights; llama.cpp
    quantises activations to 8 bits for the product, so the tolerance is Q8_0's."""
    import gguf

    model = gguf_models.llama(eos_of(tokenizer_dir))
    path = write_gguf(model, tmp_path / "q.gguf", "q8_0", tokenizer=tokenizer_dir).path
    ids = list(range(3, 40))
    ours = llamacpp_log_probs(load(path), ids)
    stored = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}
    kind = gguf.GGMLQuantizationType
    dequantised = {
        name: torch.from_numpy(gguf.quants.dequantize(t.data, kind.Q8_0).copy())
        for name, t in stored.items()
        if t.tensor_type == kind.Q8_0
    }
    reference = rounded(model, torch.float32)
    with torch.no_grad():
        for i, layer in enumerate(reference.model.layers):  # type: ignore[union-attr]
            modules = {
                "ffn_up": layer.mlp.up_proj,
                "ffn_gate": layer.mlp.gate_proj,
                "ffn_down": layer.mlp.down_proj,
                "attn_v": layer.self_attn.v_proj,
                "attn_output": layer.self_attn.o_proj,
            }
            for name, module in modules.items():
                module.weight.copy_(dequantised[f"blk.{i}.{name}.weight"])
    theirs = torch_log_probs(reference, ids)  # q and k keep their rounding error: loose bound
    assert np.abs(ours - theirs).max() < 0.05


def test_llamacpp_computes_smollm2_pruned_to_uneven_widths() -> None:
    """SmolLM2-135M-Instruct's GGUF (nox -s gguf fetches it) loaded by transformers, every layer
    cut to its own width, written in f32 with the source file's own tokenizer: llama.cpp's
    next-token log-probabilities equal transformers' to f32 precision over 30 layers."""
    source = os.environ.get("GEOSPEC_TEST_GGUF")
    if not source:
        pytest.skip("GEOSPEC_TEST_GGUF is not set: nox -s llamacpp fetches SmolLM2-135M's GGUF")
    import tempfile

    from geospec.engine.pretrained import load_pretrained
    from geospec.measure.cut import cut_ffn

    model = load_pretrained(source)
    widths = [1536 if layer % 3 == 0 else 768 - 64 * (layer % 5) for layer in range(30)]
    generator = torch.Generator().manual_seed(0)
    for layer, width in zip(model.model.layers, widths, strict=True):
        cut_ffn(layer.mlp, torch.randperm(1536, generator=generator)[:width])
    with tempfile.TemporaryDirectory() as scratch:
        path = write_gguf(model, Path(scratch) / "smol.gguf", "f32", tokenizer=Path(source)).path
        llm = load(path, n_ctx=32)
        text = "The capital of France is Paris, and the capital of Italy is"
        ids = llm.tokenize(text.encode(), add_bos=False, special=False)  # type: ignore[attr-defined]
        ours = llamacpp_log_probs(llm, ids)
        n_params = llama_cpp.llama_model_n_params(llm.model)  # type: ignore[attr-defined]
    theirs = torch_log_probs(model, ids)
    difference = np.abs(ours - theirs).max()
    print(f"SmolLM2 pruned, max |log p difference| over {len(ids)} positions: {difference:.2e}")
    assert difference < 5e-4  # 8.1e-5 measured
    # the tokenizer fields copied from the source file tokenize as transformers' reading of it
    from transformers import AutoTokenizer

    hf_tokenizer = AutoTokenizer.from_pretrained(
        str(Path(source).parent), gguf_file=Path(source).name
    )
    assert hf_tokenizer(text, add_special_tokens=False)["input_ids"] == ids
    assert n_params == sum(p.numel() for p in model.parameters())


def test_llamacpp_computes_a_trained_llama_arm_as_geospec_does(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A 2-step geospec run of the Llama family at widths 24, 80, 40, exported by geospec export
    --format gguf: llama.cpp's log-probabilities equal geospec's own model's."""
    from click.testing import CliRunner
    from test_export import train

    from geospec.cli import cli
    from geospec.engine.checkpoint import load_model

    tmp = tmp_path_factory.mktemp("arm")
    run = train(tmp, "llama", "24,80,40")
    out = tmp / "arm.gguf"
    args = ["export", str(run), "--to", str(out), "--format", "gguf", "--dtype", "f32"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    ids = list(range(5, 21))
    ours = llamacpp_log_probs(load(out), ids)
    model = load_model(run).eval()
    with torch.no_grad():
        logits, _ = model(torch.tensor([ids]))
    theirs = torch.log_softmax(logits[0].double(), dim=-1).numpy()
    assert np.abs(ours - theirs).max() < 1e-4


@pytest.mark.parametrize("compensated", [False, True])
def test_llamacpp_computes_a_pruned_qwen2_with_its_biases_to_f32_precision(
    tokenizer_dir: Path, tmp_path: Path, compensated: bool
) -> None:
    """The tiny Qwen2 of tests/test_qwen2.py (q/k/v biases), cut to uneven widths (compensated:
    a bias on every down projection too), written as deci: llama.cpp reads every bias deci's
    loader makes optional and computes transformers' log-probabilities."""
    from test_qwen2 import WIDTHS, orders_and_means, qwen2, sites_of

    from geospec.prune.apply import pruned

    model = qwen2(vocab=gguf_models.VOCAB)
    orders, means = orders_and_means(model)
    sites = sites_of(model)
    ids = list(range(3, 40))
    with torch.no_grad(), pruned(sites, orders, WIDTHS, means if compensated else None):
        path = write_gguf(model, tmp_path / "q.gguf", "f32", tokenizer=tokenizer_dir).path
        theirs = torch_log_probs(model, ids)
        parameters = sum(p.numel() for p in model.parameters())
    llm = load(path)
    ours = llamacpp_log_probs(llm, ids)
    difference = np.abs(ours - theirs).max()
    print(f"Qwen2 pruned (compensated: {compensated}), max |log p difference|: {difference:.2e}")
    assert difference < 1e-4
    assert llama_cpp.llama_model_n_params(llm.model) == parameters  # type: ignore[attr-defined]


def test_llamacpp_computes_qwen2_5_coder_pruned_to_uneven_widths() -> None:
    """Qwen2.5-Coder-0.5B-Instruct's GGUF (nox -s gguf assembles it; GEOSPEC_TEST_QWEN_GGUF)
    loaded by transformers, every layer cut to its own width, written in f32 with the source
    file's qwen2 tokenizer: llama.cpp's log-probabilities equal transformers' over 24 layers."""
    source = os.environ.get("GEOSPEC_TEST_QWEN_GGUF")
    if not source:
        pytest.skip("GEOSPEC_TEST_QWEN_GGUF is not set: nox -s gguf assembles Qwen2.5-Coder-0.5B")
    import tempfile

    from geospec.engine.pretrained import load_pretrained
    from geospec.measure.cut import cut_ffn

    model = load_pretrained(source)
    widths = [4864 if layer % 4 == 0 else 2432 - 128 * (layer % 5) for layer in range(24)]
    generator = torch.Generator().manual_seed(0)
    for layer, width in zip(model.model.layers, widths, strict=True):
        cut_ffn(layer.mlp, torch.randperm(4864, generator=generator)[:width])
    with tempfile.TemporaryDirectory() as scratch:
        path = write_gguf(model, Path(scratch) / "qwen.gguf", "f32", tokenizer=Path(source)).path
        llm = load(path, n_ctx=32)
        text = "def fibonacci(n):\n    if n < 2:\n        return n\n    return"
        ids = llm.tokenize(text.encode(), add_bos=False, special=False)  # type: ignore[attr-defined]
        ours = llamacpp_log_probs(llm, ids)
    theirs = torch_log_probs(model, ids)
    difference = np.abs(ours - theirs).max()
    print(
        f"Qwen2.5-Coder pruned, max |log p difference| over {len(ids)} positions: {difference:.2e}"
    )
    assert difference < 5e-4
    from transformers import AutoTokenizer

    hf_tokenizer = AutoTokenizer.from_pretrained(
        str(Path(source).parent), gguf_file=Path(source).name
    )
    assert hf_tokenizer(text, add_special_tokens=False)["input_ids"] == ids


def test_llamacpp_tokenizes_a_qwen2_tokenizer_as_transformers_does(tmp_path: Path) -> None:
    """The tiny Qwen2 with a BPE trained behind Qwen2's split, written as llama.cpp's converter
    writes it (the qwen2 pre-tokenizer), and its deci export with the tokenizer copied from that
    file or rebuilt from transformers' Qwen2Tokenizer.json: llama.cpp splits the text into the
    ids transformers' Qwen2Tokenizer gives (which GPT-2's split would not), and computes the
    model's log-probabilities."""
    from test_qwen2 import qwen2
    from tokenizers import Tokenizer, pre_tokenizers
    from transformers import AutoTokenizer

    gguf_models.qwen2_bpe_tokenizer(tmp_path / "bpe")
    model = qwen2(vocab=gguf_models.VOCAB)
    source = gguf_models.qwen2_gguf(tmp_path / "source.gguf", model, tmp_path / "bpe")
    hf_tokenizer = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=source.name)
    hf_tokenizer.save_pretrained(tmp_path / "tokenizer")
    text = '"I cannot," said Elizabeth; "they\'LL say it\'s 1815.\n\n  (Mr. Darcy) ...\n"'
    ids = hf_tokenizer(text, add_special_tokens=False)["input_ids"]
    gpt2_split = Tokenizer.from_file(str(tmp_path / "tokenizer" / "tokenizer.json"))
    gpt2_split.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    assert gpt2_split.encode(text).ids != ids  # the split matters for this text
    theirs = torch_log_probs(model, ids)
    for name, tokenizer in (("copied", source), ("rebuilt", tmp_path / "tokenizer")):
        path = write_gguf(model, tmp_path / f"{name}.gguf", "f32", tokenizer=tokenizer).path
        llm = load(path)
        assert llm.tokenize(text.encode(), add_bos=False, special=False) == ids, name  # type: ignore[attr-defined]
        assert np.abs(llamacpp_log_probs(llm, ids) - theirs).max() < 1e-4
