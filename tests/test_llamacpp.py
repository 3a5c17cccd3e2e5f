"""GGUF exports read by an unmodified llama.cpp (llama-cpp-python, built from its source
distribution by `nox -s llamacpp`): llama.cpp builds each layer's FFN at the width the file
gives, and its next-token log-probabilities equal transformers' on the same model to the
tolerance of the weights' type. Skipped where llama_cpp is not installed."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

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

    from geospec.prune.cut import pruned

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


def dequantized(model: torch.nn.Module, path: Path) -> torch.nn.Module:
    """A copy of ``model`` holding the GGUF file's matrices as gguf-py de-quantises them (its own
    numpy code, not llama.cpp's), the query and key rows permuted back from llama.cpp's
    interleaved pairs to transformers' rotate-half order; norms as they are (stored in f32)."""
    import copy

    import gguf

    config: Any = model.config
    kv_heads = config.num_key_value_heads or config.num_attention_heads
    stored = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}

    def values(name: str, heads: int | None = None) -> torch.Tensor:
        tensor = stored[name]
        array = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        if heads is not None:  # interleaved pairs back to each head's halves
            rows, cols = array.shape
            array = array.reshape(heads, rows // heads // 2, 2, cols).swapaxes(1, 2)
            array = array.reshape(rows, cols)
        return torch.from_numpy(np.ascontiguousarray(array))

    copied: Any = copy.deepcopy(model)
    inner = copied.model
    with torch.no_grad():
        inner.embed_tokens.weight.copy_(values("token_embd.weight"))
        if "output.weight" in stored:
            copied.lm_head.weight.copy_(values("output.weight"))
        for i, layer in enumerate(inner.layers):
            attn, mlp = layer.self_attn, layer.mlp
            attn.q_proj.weight.copy_(values(f"blk.{i}.attn_q.weight", config.num_attention_heads))
            attn.k_proj.weight.copy_(values(f"blk.{i}.attn_k.weight", kv_heads))
            attn.v_proj.weight.copy_(values(f"blk.{i}.attn_v.weight"))
            attn.o_proj.weight.copy_(values(f"blk.{i}.attn_output.weight"))
            mlp.gate_proj.weight.copy_(values(f"blk.{i}.ffn_gate.weight"))
            mlp.up_proj.weight.copy_(values(f"blk.{i}.ffn_up.weight"))
            mlp.down_proj.weight.copy_(values(f"blk.{i}.ffn_down.weight"))
    return copied


def kept_rows_agree(pruned: Path, unpruned: Path, kept: list[list[int]]) -> None:
    """Every tensor of the pruned file that pruning leaves row for row (all but ``ffn_down``,
    whose rows lose columns and so form other blocks) holds exactly the unpruned file's bytes
    for its rows: rows ``kept[l]`` of layer l's gate and up (the neurons kept), the whole of the
    rest. The same type, block for block: the unpruned model's own quantization, less the cut
    neurons."""
    import gguf

    ours = {t.name: t for t in gguf.GGUFReader(str(pruned)).tensors}
    theirs = {t.name: t for t in gguf.GGUFReader(str(unpruned)).tensors}
    assert set(ours) == set(theirs)
    for name, tensor in ours.items():
        if "ffn_down" in name:
            continue
        other = theirs[name]
        assert tensor.tensor_type == other.tensor_type, name
        rows = other.data
        if "ffn_gate" in name or "ffn_up" in name:
            rows = rows[kept[int(name.split(".")[1])]]
        np.testing.assert_array_equal(tensor.data, rows, err_msg=name)


def first(widths: list[int]) -> list[list[int]]:
    """Each layer's first ``width`` neurons: what gguf_models.llama keeps."""
    return [list(range(width)) for width in widths]


def test_llamacpp_q4_1_is_gguf_pys_q4_1_and_the_unpruned_files_rows(
    tokenizer_dir: Path, tmp_path: Path
) -> None:
    """A pruned tiny Llama (its last down projection 40 wide: rows that do not split into Q4_1's
    blocks of 32) written in Q4_1 through llama.cpp's quantizer: each matrix holds the bytes
    gguf-py's independent Q4_1 gives its weights (the tied embedding Q8_0, the 40-wide down
    projection f16, as llama.cpp's rules say); the rows it shares with the unpruned model's Q4_1
    file are that file's bytes; llama.cpp loads it at its true widths and computes
    transformers' log-probabilities on the de-quantised weights to within what quantising the
    activations to 8 bits for each product costs (llama.cpp multiplies Q4_1 rows by Q8_1
    blocks of the activations, Q8_0 by Q8_0, F16 by F16), far closer than the f32 model."""
    import gguf

    from geospec.prune.gguf_export import gguf_widths
    from geospec.prune.gguf_size import gguf_size

    eos, widths = eos_of(tokenizer_dir), [32, 96, 40]
    model = gguf_models.llama(eos, widths=widths, tied=True)
    written = write_gguf(model, tmp_path / "q.gguf", "q4_1", tokenizer=tokenizer_dir)
    assert written.quantizer == "llama.cpp's quantizer" and gguf_widths(written.path) == widths
    unpruned = gguf_models.llama(eos, widths=None, tied=True)
    whole = write_gguf(unpruned, tmp_path / "whole.gguf", "q4_1", tokenizer=tokenizer_dir)
    kept_rows_agree(written.path, whole.path, first(widths))
    kind = gguf.GGMLQuantizationType
    f32 = write_gguf(model, tmp_path / "f.gguf", "f32", tokenizer=tokenizer_dir).path
    plain = {t.name: np.asarray(t.data) for t in gguf.GGUFReader(str(f32)).tensors}
    for tensor in gguf.GGUFReader(str(written.path)).tensors:
        if tensor.name.endswith("norm.weight"):
            assert tensor.tensor_type == kind.F32
            continue
        wanted = {"token_embd.weight": kind.Q8_0, "blk.2.ffn_down.weight": kind.F16}
        assert tensor.tensor_type == wanted.get(tensor.name, kind.Q4_1), tensor.name
        ours = gguf.quants.quantize(plain[tensor.name], tensor.tensor_type)
        np.testing.assert_array_equal(tensor.data, ours, err_msg=tensor.name)
    assert fields_of(written.path)["general.file_type"] == gguf.LlamaFileType.MOSTLY_Q4_1
    f16 = write_gguf(model, tmp_path / "h.gguf", "f16", tokenizer=tokenizer_dir)
    assert gguf_size(written.path).f16_bytes == f16.bytes > written.bytes  # llama.cpp's layout
    llm = load(written.path)
    assert llama_cpp.llama_model_n_params(llm.model) == written.parameters  # type: ignore[attr-defined]
    ids = list(range(3, 40))
    ours_lp = llamacpp_log_probs(llm, ids)
    reference = torch_log_probs(dequantized(model, written.path), ids)
    unquantized = torch_log_probs(model, ids)
    near, far = np.abs(ours_lp - reference).max(), np.abs(ours_lp - unquantized).max()
    print(f"tiny Llama Q4_1: max |log p difference| {near:.2e} (from the f32 model: {far:.2e})")
    assert near < 0.02 and near < far / 3


def fields_of(path: Path) -> dict[str, object]:
    import gguf

    return {key: field.contents() for key, field in gguf.GGUFReader(str(path)).fields.items()}


def test_llamacpp_q4_k_m_holds_the_unpruned_files_rows_and_computes_its_weights(
    tokenizer_dir: Path, tmp_path: Path
) -> None:
    """A Llama 256 wide (so K-quants' blocks of 256 fit its rows) pruned to 256, 512 and 320
    written in Q4_K_M by llama.cpp's quantizer: its gate and up in Q4_K, layer 2's down
    projection (its rows 320 wide) fallen back as llama.cpp falls back (from Q6_K, which the
    mix gives that layer, to Q8_0), said by the export's count; the rows it shares with the
    unpruned model's Q4_K_M file are that file's bytes; its de-quantised weights stay within
    Q4_K's error of the model's; llama.cpp computes transformers' log-probabilities on them to
    within the 8-bit quantisation of the activations (Q8_K blocks for the K-quant products)."""
    import gguf

    from geospec.prune.gguf_quant import fallbacks

    eos, widths = eos_of(tokenizer_dir), [256, 512, 320]
    model = gguf_models.llama(eos, widths=widths, hidden=256, full=512)
    written = write_gguf(model, tmp_path / "k.gguf", "q4_k_m", tokenizer=tokenizer_dir)
    unpruned = gguf_models.llama(eos, widths=None, hidden=256, full=512)
    whole = write_gguf(unpruned, tmp_path / "whole.gguf", "q4_k_m", tokenizer=tokenizer_dir)
    kept_rows_agree(written.path, whole.path, first(widths))
    kind = gguf.GGMLQuantizationType
    types = {t.name: t.tensor_type for t in gguf.GGUFReader(str(written.path)).tensors}
    assert types["blk.1.ffn_gate.weight"] == types["blk.1.ffn_up.weight"] == kind.Q4_K
    assert types["blk.2.ffn_down.weight"] == kind.Q8_0 and types["output.weight"] == kind.Q6_K
    assert fallbacks(written.path, "q4_k_m") == {"Q8_0": 1}
    assert fields_of(written.path)["general.file_type"] == gguf.LlamaFileType.MOSTLY_Q4_K_M
    reference = dequantized(model, written.path)
    for ours, theirs in zip(reference.parameters(), model.parameters(), strict=True):
        if ours.ndim == 2:  # 4.5 bits a weight: a few percent of the weights' spread
            assert (ours - theirs).pow(2).mean().sqrt() < 0.1 * theirs.std()
    llm = load(written.path)
    assert llama_cpp.llama_model_n_params(llm.model) == written.parameters  # type: ignore[attr-defined]
    ids = list(range(3, 40))
    ours_lp = llamacpp_log_probs(llm, ids)
    near = np.abs(ours_lp - torch_log_probs(reference, ids)).max()
    far = np.abs(ours_lp - torch_log_probs(model, ids)).max()
    print(f"tiny Llama Q4_K_M: max |log p difference| {near:.2e} (from the f32 model: {far:.2e})")
    # Q8_K scales a block of 256 activations by its largest: coarser than Q8_1's 32 (1.6e-2
    # measured), the bound the Q8_0 test above allows
    assert near < 0.05 and near < far / 3


def kl_divergence(log_p: np.ndarray, log_q: np.ndarray) -> float:
    """The mean over positions of KL(p || q), in nats."""
    return float((np.exp(log_p) * (log_p - log_q)).sum(-1).mean())


def test_llamacpp_computes_smollm2_pruned_and_written_in_its_sources_q4_1() -> None:
    """SmolLM2-135M-Instruct's Q4_1 GGUF (GEOSPEC_TEST_GGUF) read by transformers, every layer
    cut to its own width (random neurons, half of them in all), exported as geospec export does
    by default: in the source's Q4_1, by llama.cpp's quantizer, smaller than the source file.
    Quantized like its source: every tensor but the down projections holds the source file's
    own Q4_1 (Q8_0 for the embedding) blocks for the rows it keeps, byte for byte, and each down
    projection gguf-py's Q4_1 of its kept columns. llama.cpp loads it at its true widths and
    computes transformers' next-token distribution on its de-quantised weights to within what
    llama.cpp's 8-bit activations cost (Q8_1 blocks against Q4_1 weights): on the unpruned
    source file itself that costs a mean KL of 4.6e-3 nats (measured, printed); the model cut at
    random, half its neurons gone, is more sensitive (3.5e-2 measured); the bound is 0.1,
    against 0.66 from the unquantized pruned model."""
    source = os.environ.get("GEOSPEC_TEST_GGUF")
    if not source:
        pytest.skip("GEOSPEC_TEST_GGUF is not set: nox -s llamacpp fetches SmolLM2-135M's GGUF")
    import tempfile

    import gguf

    from geospec.engine.pretrained import load_pretrained
    from geospec.measure.cut import cut_ffn
    from geospec.prune.gguf_quant import default_dtype

    model = load_pretrained(source)
    text = "The capital of France is Paris, and the capital of Italy is"
    llm = load(Path(source), n_ctx=32)
    ids = llm.tokenize(text.encode(), add_bos=False, special=False)  # type: ignore[attr-defined]
    unpruned = kl_divergence(llamacpp_log_probs(llm, ids), torch_log_probs(model, ids))
    widths = [1536 if layer in (0, 29) else 704 + 64 * (layer % 3) for layer in range(30)]
    generator = torch.Generator().manual_seed(0)
    kept = []
    for layer, width in zip(model.model.layers, widths, strict=True):
        kept.append(sorted(torch.randperm(1536, generator=generator)[:width].tolist()))
        cut_ffn(layer.mlp, kept[-1])
    dtype, why = default_dtype(Path(source))
    assert dtype == "q4_1" and "source" in why
    with tempfile.TemporaryDirectory() as scratch:
        written = write_gguf(model, Path(scratch) / "smol.gguf", dtype, tokenizer=Path(source))
        kept_rows_agree(written.path, Path(source), kept)
        stored = {t.name: t for t in gguf.GGUFReader(str(written.path)).tensors}
        for i, layer in enumerate(model.model.layers):
            down = layer.mlp.down_proj.weight.detach().numpy()
            q4_1 = gguf.quants.quantize(down, gguf.GGMLQuantizationType.Q4_1)
            np.testing.assert_array_equal(stored[f"blk.{i}.ffn_down.weight"].data, q4_1)
        llm = load(written.path, n_ctx=32)
        ours = llamacpp_log_probs(llm, ids)
        n_params = llama_cpp.llama_model_n_params(llm.model)  # type: ignore[attr-defined]
        reference = dequantized(model, written.path)
    near = kl_divergence(ours, torch_log_probs(reference, ids))
    far = kl_divergence(ours, torch_log_probs(model, ids))
    ratio = written.bytes / Path(source).stat().st_size
    print(
        f"SmolLM2 pruned, Q4_1: {written.bytes:,} bytes, {ratio:.3f}x the source's; mean KL "
        f"from transformers on its weights {near:.2e} nats over {len(ids)} positions (unpruned "
        f"source file: {unpruned:.2e}; from the unquantized pruned model: {far:.2e})"
    )
    assert written.bytes < Path(source).stat().st_size
    assert n_params == sum(p.numel() for p in model.parameters())
    assert near < 0.1 and near < far / 5


def test_the_speed_of_an_export_is_measured_against_its_source(
    tokenizer_dir: Path, tmp_path: Path
) -> None:
    """geospec prune --export ... --format gguf's speed line: both files run in llama.cpp, every
    figure positive, the best of the rounds no slower than their median, and the line gives
    best and median ratios and the machine's load."""
    import re

    from geospec.prune.runtime import compare_speeds, speed_line

    model = gguf_models.llama(eos_of(tokenizer_dir))
    source = write_gguf(model, tmp_path / "source.gguf", "f32", tokenizer=tokenizer_dir).path
    smaller = write_gguf(model, tmp_path / "smaller.gguf", "q8_0", tokenizer=tokenizer_dir).path
    timings = compare_speeds([smaller, source], prompt=16, generate=4, repeats=3)
    for timing in timings:
        assert timing.rounds == 3 and timing.median.prompt > 0 and timing.median.generation > 0
        assert timing.best.prompt >= timing.median.prompt
        assert timing.best.generation >= timing.median.generation
    line = speed_line(smaller, source)
    ratios = [float(r) for r in re.findall(r"([\d.]+)x (?:best|median)", line)]
    assert len(ratios) == 4 and all(r > 0 for r in ratios)
    assert re.search(r"; load [\d.]+/[\d.]+/[\d.]+ on \d+ cores", line)


def test_what_to_ship_times_the_recommended_model_against_its_source(tmp_path: Path) -> None:
    """prune.select from a GGUF reference (the tiny Qwen2 in Q8_0): the recommended model's GGUF
    file is written by llama.cpp's quantizer in the source's type, is the size of the file
    `--export best@0.5 --format gguf` writes, and is run in llama.cpp against the source file
    (best and median of 5 round-robin rounds on 2 threads, the load beside them); the report
    prints the ratios of the speeds it
    recorded. With select.runtime = false the record is measured again untimed and no unit is
    computed again."""
    from test_prune import invoke
    from test_select import gguf_prune_spec

    output = invoke("prune", str(gguf_prune_spec(tmp_path, export=False)))
    run = tmp_path / "run"
    chosen = json.loads((run / "prune.json").read_text())["budgets"][0]["recommended"]
    shipped, speed = chosen["shipped"], chosen["shipped"]["speed"]
    assert shipped["gguf"]["quantizer"] == "llama.cpp's quantizer"
    assert shipped["gguf"]["type"] == shipped["gguf"]["source_type"] == "Q8_0"
    assert shipped["score"]["windows"] == 2  # the llama.cpp-quantized file scored as shipped
    assert (speed["threads"], speed["rounds"]) == (2, 5)
    assert (speed["prompt_tokens"], speed["generated_tokens"]) == (128, 32)
    rates = [speed[k] for k in ("prompt", "generation", "source_prompt", "source_generation")]
    medians = [speed[f"{k}_median"] for k in
               ("prompt", "generation", "source_prompt", "source_generation")]  # fmt: skip
    assert all(rate >= median > 0 for rate, median in zip(rates, medians, strict=True))
    assert len(speed["load"]) == 3 and speed["cores"] >= 1
    prompt, generation = rates[0] / rates[2], rates[1] / rates[3]
    said = (
        f"llama.cpp prompt {prompt:.2f}x best, {medians[0] / medians[2]:.2f}x median, "
        f"generation {generation:.2f}x best, {medians[1] / medians[3]:.2f}x median the source's ("
    )
    assert said in output and "2 threads, 5 rounds; load " in output
    print(f"tiny Qwen2, keep 0.5, {chosen['arm']}: {said}{rates[0]:,.0f} and {rates[1]:,.1f} tok/s")
    target = tmp_path / "exported" / f"{chosen['arm']}-0.5.gguf"
    target.parent.mkdir()
    spec = tmp_path / "spec.toml"
    invoke("prune", str(spec), "--export", "best@0.5", "--format", "gguf", "--to", str(target))
    assert shipped["gguf"]["bytes"] == os.path.getsize(target)
    units = {p: p.stat().st_mtime_ns for p in (run / "prune").glob("keep-*/*/seed-*/result.json")}
    untimed = gguf_prune_spec(tmp_path, export=False, select={"windows": 2, "runtime": False})
    output = invoke("prune", str(untimed))
    assert "measuring what the recommended" in output
    assert {p: p.stat().st_mtime_ns for p in units} == units
    again = json.loads((run / "prune.json").read_text())["budgets"][0]["recommended"]["shipped"]
    assert again["speed"] == {"skipped": "prune.select.runtime = false"}
    assert again["gguf"] == shipped["gguf"] and again["key"] != shipped["key"]
    assert "no llama.cpp speed (prune.select.runtime = false)" in output
