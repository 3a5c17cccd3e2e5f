"""`geospec validate` checks a spec against the files it names, before anything is loaded: what the
prune would otherwise reject after the probe (or in a traceback), one line each, exit 2.

Every checkpoint here is a config.json (or a GGUF header) written by the test: nothing is
downloaded and torch is not needed."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from click.testing import CliRunner

from geospec.cli import cli
from geospec.errors import UsageError
from geospec.shapes.pruned import pruned_dims

LLAMA = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "intermediate_size": 256,
    "vocab_size": 100,
    "max_position_embeddings": 512,
}
PRUNE = '[prune]\nkeep = 0.5\n\n[[prune.arms]]\nname = "uniform"\nschedule = { kind = "uniform" }\n'


def spec(
    directory: Path, config: dict[str, object] | None = None, *, body: str = PRUNE, top: str = ""
) -> Path:
    """A pruning spec of the checkpoint ``directory/model`` (its config.json ``config``)."""
    (directory / "model").mkdir(exist_ok=True)
    (directory / "model" / "config.json").write_text(json.dumps(config or LLAMA))
    path = directory / "spec.toml"
    path.write_text(
        f'name = "t"\nmeasure = []\n{top}\n[model]\nseq_len = 64\nmultiple_of = 16\n\n'
        f'[reference]\ncheckpoint = "model"\n\n{body}'
    )
    return path


def validate(path: Path, *options: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["validate", str(path), *options])
    assert "Traceback" not in result.output
    return result.exit_code, result.output


def problem_line(output: str, field: str) -> str:
    """The one line that names ``field``."""
    lines = [line for line in output.splitlines() if f"{field}:" in line]
    assert len(lines) == 1, output
    return lines[0]


def test_the_spec_of_a_sound_checkpoint_is_valid(tmp_path: Path) -> None:
    code, output = validate(spec(tmp_path))
    assert code == 0, output


def test_a_keep_fraction_below_one_multiple_is_refused_like_the_prune_does(tmp_path: Path) -> None:
    """256 neurons in multiples of 16: keep 0.03 is 7.68 neurons, 0.48 multiples, rounding to 0;
    keep 0.04 is 10.24 neurons, 0.64 multiples, rounding to one (16 neurons)."""
    code, output = validate(spec(tmp_path, body=PRUNE.replace("0.5", "[0.5, 0.03]")))
    assert code == 2
    line = problem_line(output, "prune.keep[1]")
    assert "0.03 of 256 neurons rounds below one multiple (16)" in line
    with pytest.raises(UsageError) as refused:  # the prune stage's own rule, the same words
        pruned_dims(2, 64, 256, 16, 0.03, "swiglu")
    assert line.split("prune.keep[1]: ")[1] in str(refused.value)
    code, output = validate(spec(tmp_path, body=PRUNE.replace("0.5", "0.04")))
    assert code == 0, output
    assert pruned_dims(2, 64, 256, 16, 0.04, "swiglu").ffn_width == 16


def test_a_missing_eval_corpus_file_is_named(tmp_path: Path) -> None:
    corpora = 'eval = { corpora = ["bundled:austen", "held-out.txt"] }\n'
    body = PRUNE.replace("keep = 0.5\n", "keep = 0.5\n" + corpora)
    code, output = validate(spec(tmp_path, body=body))
    assert code == 2
    line = problem_line(output, "prune.eval.corpora[1]")
    assert str(tmp_path / "held-out.txt") in line and "does not exist" in line
    (tmp_path / "held-out.txt").write_text("Some text.\n")  # relative to the spec file
    assert validate(tmp_path / "spec.toml")[0] == 0


@pytest.mark.parametrize(
    ("config", "key"),
    [
        (LLAMA, "max_position_embeddings"),
        (
            {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 100,
             "n_positions": 512},
            "n_positions",
        ),
    ],
    ids=["llama", "gpt2"],
)  # fmt: skip
def test_a_sequence_longer_than_the_checkpoints_positions_is_refused(
    tmp_path: Path, config: dict[str, object], key: str
) -> None:
    path = spec(tmp_path, config)
    code, output = validate(path, "--set", "model.seq_len=1024")
    assert code == 2
    line = problem_line(output, "model.seq_len")
    assert f"1024 is beyond the checkpoint's 512 positions ({key}" in line
    assert "at most 512" in line
    assert validate(path, "--set", "model.seq_len=512")[0] == 0


def gguf_header(path: Path, values: dict[str, int | str | list[str]]) -> None:
    """A GGUF v3 file holding only metadata (the documented layout: magic, version, tensor and
    key counts, then each key with its value type: 4 uint32, 8 string, 9 array)."""

    def string(text: str) -> bytes:
        return struct.pack("<Q", len(text.encode())) + text.encode()

    body = b""
    for key, value in values.items():
        if isinstance(value, str):
            body += string(key) + struct.pack("<I", 8) + string(value)
        elif isinstance(value, list):  # an array of strings: 9, then its element type and length
            body += string(key) + struct.pack("<IIQ", 9, 8, len(value))
            body += b"".join(string(item) for item in value)
        else:
            body += string(key) + struct.pack("<I", 4) + struct.pack("<I", value)
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, len(values)) + body)


#: The metadata of a 2-layer Llama GGUF with 128 positions (no tensors: validate reads the header).
SMALL_LLAMA: dict[str, int | str | list[str]] = {
    "general.architecture": "llama", "llama.block_count": 2, "llama.embedding_length": 64,
    "llama.attention.head_count": 4, "llama.feed_forward_length": 256,
    "llama.vocab_size": 100, "llama.context_length": 128,
}  # fmt: skip


def test_a_gguf_context_length_bounds_the_sequence(tmp_path: Path) -> None:
    gguf_header(tmp_path / "m.gguf", SMALL_LLAMA)
    path = spec(tmp_path)
    code, output = validate(path, "--set", "reference.checkpoint=m.gguf")
    assert code == (2 if gguf_extra_missing() else 0), output
    code, output = validate(
        path, "--set", "reference.checkpoint=m.gguf", "--set", "model.seq_len=256"
    )
    assert code == 2
    assert "beyond the checkpoint's 128 positions (llama.context_length" in problem_line(
        output, "model.seq_len"
    )


def gguf_extra_missing() -> list[str]:
    """The packages of the gguf extra this environment lacks (the core session has none)."""
    import importlib.util

    from geospec.spec.file_checks import GGUF_EXTRA

    return [name for name in GGUF_EXTRA if importlib.util.find_spec(name) is None]


def test_a_gguf_checkpoint_without_the_gguf_extra_names_the_install(tmp_path: Path) -> None:
    """transformers needs gguf (and accelerate) to read a GGUF file: validate names what is
    missing and the install command where they are not installed, and says nothing where they
    are (`nox -s core` runs this without them, `tests` with them)."""
    gguf_header(tmp_path / "m.gguf", SMALL_LLAMA)
    code, output = validate(spec(tmp_path), "--set", "reference.checkpoint=m.gguf")
    missing = gguf_extra_missing()
    if not missing:
        assert code == 0 and "geospec[gguf]" not in output, output
        return
    assert code == 2
    line = problem_line(output, "reference.checkpoint")
    assert f"needs {' and '.join(missing)}, which are not installed" in line
    assert line.endswith('pip install "geospec[gguf]"')


PHI3 = {
    "model_type": "phi3",
    "architectures": ["Phi3ForCausalLM"],
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "intermediate_size": 256,
    "vocab_size": 100,
    "max_position_embeddings": 512,
}
#: [model] in full: geospec does not read a Phi-3 config's shape, so the spec gives it
FULL_MODEL = (
    "n_layers=2", "d_model=64", "n_heads=4", "ffn_width=256", "vocab_size=100",
    'activation="swiglu"', 'norm="rmsnorm"', 'positions="rope"',
)  # fmt: skip


@pytest.mark.parametrize(
    ("config", "said"),
    [
        (PHI3, "the FFN of phi3 (Phi3ForCausalLM): it fuses the gate and up projections"),
        (
            LLAMA | {"model_type": "mixtral", "architectures": ["MixtralForCausalLM"],
                     "num_local_experts": 8},
            "the FFN of mixtral (MixtralForCausalLM): a mixture of 8 experts",
        ),
    ],
    ids=["phi3", "mixtral"],
)  # fmt: skip
def test_an_ffn_layout_the_cut_does_not_support_is_named(
    tmp_path: Path, config: dict[str, object], said: str
) -> None:
    overrides = [a for m in FULL_MODEL for a in ("--set", f"model.{m}")]
    code, output = validate(spec(tmp_path, config), *overrides)
    assert code == 2
    line = problem_line(output, "reference.checkpoint")
    assert "[prune] cannot cut " + said in line and "gate_proj/up_proj/down_proj" in line


def tokenizer_json(directory: Path, words: int, added: int | None = None) -> None:
    directory.mkdir(exist_ok=True)
    vocab = {f"w{i}": i for i in range(words)}
    added_tokens = [] if added is None else [{"id": added, "content": "<extra>", "special": True}]
    (directory / "tokenizer.json").write_text(
        json.dumps({"model": {"type": "WordLevel", "vocab": vocab}, "added_tokens": added_tokens})
    )


def test_a_tokenizer_with_more_ids_than_the_model_has_embeddings_is_refused(
    tmp_path: Path,
) -> None:
    """The checkpoint embeds 100 tokens; a tokenizer of 90 words plus an added token with id
    119 defines 120 ids, of which 20 have no embedding row (an IndexError in the forward pass)."""
    path = spec(tmp_path)
    tokenizer_json(tmp_path / "model", 100)  # its own: fits exactly
    assert validate(path)[0] == 0
    tokenizer_json(tmp_path / "other", 90, added=119)
    other = 'data.tokenizer={ kind = "pretrained", path = "other" }'
    code, output = validate(path, "--set", other)
    assert code == 2
    line = problem_line(output, "data.tokenizer.path")
    assert "has 120 token ids (tokenizer.json), more than the checkpoint's vocab_size 100" in line
    assert "leave data.tokenizer out" in line


HUGE = {
    "model_type": "llama",
    "num_hidden_layers": 512,
    "hidden_size": 16384,
    "num_attention_heads": 128,
    "intermediate_size": 65536,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
}


def test_a_checkpoint_too_large_for_this_machine_is_refused_with_the_fixes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """512 layers of d_model 16384 and FFN width 65536: 4 * 16384^2 + 3 * 16384 * 65536 weights
    per layer, 2.2 trillion in all, 8 TiB in float32 (16 with the exported copy); no test
    machine has that free."""
    monkeypatch.delenv("GEOSPEC_SKIP_MEMORY_CHECK", raising=False)
    train = 'probe_only = true\n\n[train]\nsteps = 1\ndevice = "cpu"\n'
    path = spec(tmp_path, HUGE, top=train)
    code, output = validate(path)
    assert code == 2
    line = problem_line(output, "reference.dtype")
    assert "needs at least" in line and "TiB" in line
    assert "parameters in float32, twice" in line and 'reference.dtype = "bfloat16"' in line
    assert "prune.export = false" in line and "GEOSPEC_SKIP_MEMORY_CHECK=1" in line
    monkeypatch.setenv("GEOSPEC_SKIP_MEMORY_CHECK", "1")
    assert validate(path)[0] == 0
    monkeypatch.delenv("GEOSPEC_SKIP_MEMORY_CHECK")
    # `geospec widths` loads no checkpoint: it does not ask
    result = CliRunner().invoke(cli, ["widths", str(path)])
    assert "reference.dtype" not in result.output


def test_the_loading_check_counts_autocasts_copy_of_the_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under a bfloat16 compute dtype torch keeps a bfloat16 copy of every float32 weight it
    casts: 2 bytes a parameter more beside the reference's 4 and the exported copy's 4 (the
    HUGE checkpoint: 16 TiB, and 20 with the bfloat16 copy)."""
    monkeypatch.delenv("GEOSPEC_SKIP_MEMORY_CHECK", raising=False)
    top = 'probe_only = true\n\n[train]\nsteps = 1\ndevice = "cpu"\n'
    needs = {}
    for dtype in ("float32", "bfloat16"):
        (tmp_path / dtype).mkdir()
        path = spec(tmp_path / dtype, HUGE, top=top + f'\n[probe]\ncompute_dtype = "{dtype}"\n')
        code, output = validate(path)
        assert code == 2
        line = problem_line(output, "reference.dtype")
        needs[dtype] = float(line.split("needs at least ")[1].split(" TiB")[0])
        assert ('set compute_dtype = "float32"' in line) == (dtype == "bfloat16")
    assert needs["bfloat16"] == pytest.approx(1.25 * needs["float32"], rel=0.01)


def test_a_gguf_tokenizer_with_more_tokens_than_the_model_has_embeddings_is_refused(
    tmp_path: Path,
) -> None:
    """Another model's GGUF file as the tokenizer: its 120 tokens against the checkpoint's 100."""
    tokens = [f"t{i}" for i in range(120)]
    gguf_header(
        tmp_path / "other.gguf",
        {"general.architecture": "llama", "tokenizer.ggml.tokens": tokens},
    )
    other = 'data.tokenizer={ kind = "pretrained", path = "other.gguf" }'
    code, output = validate(spec(tmp_path), "--set", other)
    assert code == 2
    line = problem_line(output, "data.tokenizer.path")
    assert (
        "has 120 token ids (tokenizer.ggml.tokens), more than the checkpoint's vocab_size 100"
        in line
    )
