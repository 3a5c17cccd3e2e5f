"""The demand stage end to end (``geospec demand``, ``[demand]`` in ``geospec run``): what
demand.json holds against independent recomputation, its profiles in the solver, the report
section, reuse on rerun, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tomlkit
import torch
import transformers as hf
from click.testing import CliRunner

from geospec.cli import cli
from geospec.errors import SpecError
from geospec.spec.loading import load_spec, validate_spec
from geospec.testing import minimal_spec

pytestmark = pytest.mark.torch

SPEC = """
name = "demand-test"
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

[demand]
enabled = true
keep = [0.75, 0.5, 0.25]
windows = 6
batch_size = 4
pairs = 3

[[measure]]
geometry = { kind = "spherical" }
statistic = { kind = "shift" }

[[arms]]
name = "uniform"
schedule = { kind = "uniform" }

[[arms]]
name = "calibrated"
schedule = { kind = "calibrated" }

[train]
steps = 40
batch_size = 8
lr = 3e-3
threads = 1
"""


def invoke(*args: str, code: int = 0) -> str:
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code == code, result.output + repr(result.exception)
    return result.output


def write_spec(directory: Path, text: str = SPEC, **changes: object) -> Path:
    document = tomlkit.parse(text)
    document["out"] = str(directory / "run")
    for dotted, value in changes.items():
        table, key = dotted.split("__")
        document[table][key] = value  # type: ignore[index]
    path = directory / "spec.toml"
    path.write_text(tomlkit.dumps(document))
    return path


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("demand")
    output = invoke("demand", str(write_spec(directory)))
    (directory / "output.txt").write_text(output)
    return directory


def test_demand_writes_demand_json_and_trains_no_arm(measured: Path) -> None:
    output = (measured / "output.txt").read_text()
    # progress counts one cut (or walk step) of one batch: 2 batches x (4 x (3 + 1) + 3)
    assert "calibrating: 20/20" in output and "15 cuts, forward passes: 38/38" in output
    assert "full forward passes" not in output and "demand: per layer" in output
    run_dir = measured / "run"
    demand = json.loads((run_dir / "demand.json").read_text())
    assert not (run_dir / "arms").exists() and (run_dir / "plots" / "demand.png").exists()
    assert demand["keep"] == [0.75, 0.5, 0.25] and demand["multiple"] == 8
    for row, order in zip(demand["layers"], demand["orders"], strict=True):
        assert sorted(order) == list(range(64))  # a permutation of the layer's neurons
        assert row["kept"] == [48, 32, 16]
    assert len(demand["additivity"]["pairs"]) == 3
    assert set(demand["profiles"]) == {
        "demand/lambda",
        "demand/exponent",
        "demand/slope",
        "demand/f0.75",
        "demand/f0.5",
        "demand/f0.25",
    }
    assert set(demand["correlations"]) == {"shift/spherical"}


def reference_model_and_batches(
    measured: Path,
) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    from geospec.engine.batches import window_tensors
    from geospec.engine.checkpoint import load_model
    from geospec.engine.token_data import prepare_data

    spec = load_spec(measured / "spec.toml")
    run_dir = measured / "run"
    data = prepare_data(spec.data, run_dir / "data", spec_dir=measured)
    x, y = window_tensors(data.val, np.arange(6), 32)
    return load_model(run_dir / "reference").eval(), x, y


def test_a_recorded_cut_is_the_loss_of_the_model_with_those_neurons_removed(
    measured: Path,
) -> None:
    """Independent of the stage: the loss of the reference with layer 2's FFN rebuilt from the
    kept rows and columns by hand (the recorded ordering's best 16), minus the uncut loss."""
    demand = json.loads((measured / "run" / "demand.json").read_text())
    model, x, y = reference_model_and_batches(measured)
    with torch.no_grad():
        _, base = model(x, y)
        keep = sorted(demand["orders"][2][:16])
        ffn = model.blocks[2].ffn
        small = torch.nn.Linear(32, 16), torch.nn.Linear(16, 32)
        small[0].weight.copy_(ffn.fc.weight[keep])
        small[0].bias.copy_(ffn.fc.bias[keep])
        small[1].weight.copy_(ffn.proj.weight[:, keep])
        small[1].bias.copy_(ffn.proj.bias)
        ffn.fc, ffn.proj = small
        _, cut = model(x, y)
    assert demand["loss"]["base"] == pytest.approx(float(base), rel=1e-5)
    assert demand["layers"][2]["increase"][2] == pytest.approx(float(cut - base), abs=2e-5)


def test_the_activation_ordering_is_by_mean_activation_times_output_norm(measured: Path) -> None:
    """The calibration runs the probe's windows (meta.json records them) through the model."""
    from geospec.engine.token_data import prepare_data

    run_dir = measured / "run"
    demand = json.loads((run_dir / "demand.json").read_text())
    model, _, _ = reference_model_and_batches(measured)
    spec = load_spec(measured / "spec.toml")
    data = prepare_data(spec.data, run_dir / "data", spec_dir=measured)
    windows = json.loads((run_dir / "clouds" / "meta.json").read_text())["windows"]
    ids = torch.as_tensor(np.stack([data.val[w : w + 32].astype(np.int64) for w in windows]))
    hidden: list[torch.Tensor] = []
    ffn = model.blocks[1].ffn
    handle = ffn.proj.register_forward_pre_hook(lambda m, a: hidden.append(a[0]))
    with torch.no_grad():
        model(ids)
    handle.remove()
    score = hidden[0].abs().mean(dim=(0, 1)) * ffn.proj.weight.norm(dim=0)
    expected = torch.argsort(-score.double(), stable=True).tolist()
    assert demand["orders"][1][:32] == expected[:32]


def test_the_calibrated_arm_and_the_report_use_the_demand(measured: Path) -> None:
    output = invoke("run", str(measured / "spec.toml"))
    assert "demand: up to date" in output  # measured by `geospec demand` with the same settings
    run_dir = measured / "run"
    widths = json.loads((run_dir / "widths.json").read_text())["arms"]["calibrated"]["widths"]
    assert sum(widths) == 4 * 64 and all(w % 8 == 0 for w in widths)
    profiles = json.loads((run_dir / "demand.json").read_text())["profiles"]
    # the layer with the largest fitted lambda gets no less than the one with the smallest
    lam = profiles["demand/lambda"]
    assert widths[lam.index(max(lam))] >= widths[lam.index(min(lam))]
    report = (run_dir / "report.md").read_text()
    assert "## Measured demand of the reference model" in report
    assert "plots/demand.png" in report and "| shift/spherical |" in report


def test_a_changed_importance_measures_again_and_a_new_profile_only_correlates(
    measured: Path,
) -> None:
    spec_path = measured / "spec.toml"
    before = json.loads((measured / "run" / "demand.json").read_text())
    spec_path.write_text(
        spec_path.read_text().replace(
            "[[arms]]",
            '[[measure]]\ngeometry = { kind = "hyperbolic" }\nstatistic = { kind = "shift" }\n\n'
            "[[arms]]",
            1,
        )
    )
    output = invoke("demand", str(spec_path))
    assert "calibrating" not in output and "cuts:" not in output  # the measurement is reused
    after = json.loads((measured / "run" / "demand.json").read_text())
    assert after["layers"] == before["layers"] and "shift/hyperbolic" in after["correlations"]
    spec_path.write_text(
        spec_path.read_text().replace("pairs = 3", 'pairs = 3\nimportance = "magnitude"')
    )
    output = invoke("demand", str(spec_path))
    assert "magnitude ordering" in output and "calibrating" not in output


# bad input


@pytest.mark.parametrize(
    ("demand", "field", "message"),
    [
        ({"keep": [0.5, 1.0]}, "demand.keep[1]", "less than 1"),
        ({"keep": [0.0, 0.5]}, "demand.keep[0]", "greater than 0"),
        ({"keep": [0.5]}, "demand.keep", "at least 2"),
        ({"keep": [0.5, 0.5]}, "demand", "distinct"),
        ({"keep": [0.75, 0.25], "pair_keep": 0.5}, "demand", "pair_keep 0.5 is not one of keep"),
        ({"keep": [0.5, 0.05], "enabled": True}, "demand.keep[1]", "rounds below one multiple"),
        ({"importance": {"kind": "wanda"}}, "demand.importance", "wanda"),
    ],
)
def test_bad_demand_settings_name_the_field(
    demand: dict[str, object], field: str, message: str
) -> None:
    with pytest.raises(SpecError) as error:
        validate_spec(minimal_spec(demand=demand))
    assert field in str(error.value) and message in str(error.value)


def test_demand_profiles_need_the_demand_stage() -> None:
    arms = [
        {"name": "uniform", "schedule": {"kind": "uniform"}},
        {"name": "c", "schedule": {"kind": "calibrated"}},
    ]
    with pytest.raises(SpecError) as error:
        validate_spec(minimal_spec(arms=arms))
    assert "arms[1].schedule.sensitivity" in str(error.value)
    assert "[demand] enabled = true" in str(error.value)
    assert validate_spec(minimal_spec(arms=arms, demand={"enabled": True})).demand.enabled


def test_a_model_whose_ffn_cannot_be_cut_is_one_line(tmp_path: Path) -> None:
    """Phi-3 fuses its gate and up projections into one matrix (and its layer's last call is a
    dropout after the MLP): refused naming the layer, exit 2."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "</s>": 1} | {f"w{i}": i + 2 for i in range(95)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    hf.PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="</s>", unk_token="[UNK]"
    ).save_pretrained(tmp_path / "model")
    config = hf.Phi3Config(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=2,
        bos_token_id=0,
        eos_token_id=1,
    )
    hf.Phi3ForCausalLM(config).save_pretrained(tmp_path / "model")
    rng = np.random.default_rng(0)
    lines = [json.dumps({"text": " ".join(f"w{j}" for j in rng.integers(0, 95, 60))})]
    (tmp_path / "docs.jsonl").write_text("\n".join(lines * 200))
    spec = minimal_spec(
        out=str(tmp_path / "run"),
        data={"files": ["docs.jsonl"], "tokenizer": {"kind": "pretrained", "path": ""}},
        reference={"checkpoint": str(tmp_path / "model")},
        probe={"tokens": 64},
        measure=[],
        demand={"windows": 2, "pairs": 0, "importance": "magnitude"},
        probe_only=True,
    )
    spec["data"]["tokenizer"]["path"] = str(tmp_path / "model")
    (tmp_path / "spec.toml").write_text(tomlkit.dumps(spec))
    result = CliRunner().invoke(cli, ["demand", str(tmp_path / "spec.toml")])
    assert result.exit_code == 2, result.output
    last = result.output.strip().splitlines()[-1]
    assert "FFN of Phi3DecoderLayer" in last and "cannot cut the neurons" in last
    assert "Traceback" not in result.output
    assert not (tmp_path / "run" / "demand.json").exists()


def test_a_demand_json_fitted_by_an_earlier_geospec_is_fitted_again(measured: Path) -> None:
    """Written (and sealed) before the fits recorded exponent_at_bound: the measurement is
    reused, the fits are computed again."""
    from geospec.storage.digests import sealed, unsealed

    path = measured / "run" / "demand.json"
    before = json.loads(path.read_text())
    old = unsealed(json.loads(path.read_text()))
    for row in old["layers"]:
        del row["fit"]["exponent_at_bound"]
    path.write_text(json.dumps(sealed(old)))
    output = invoke("demand", str(measured / "spec.toml"))
    assert "holds fits of an earlier geospec" in output and "cuts:" not in output
    assert json.loads(path.read_text())["layers"] == before["layers"]


def test_the_stages_share_one_loaded_trained_reference(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probe and demand stages read the run's trained reference/: one load per process
    (as a pretrained checkpoint's), and a later pipeline loads it afresh."""
    import geospec.engine.checkpoint as checkpoint

    real = checkpoint.load_model
    loads: list[Path] = []

    def counted(directory: Path, *args: object, **kwargs: object) -> object:
        loads.append(Path(directory))
        return real(directory, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(checkpoint, "load_model", counted)
    spec = write_spec(tmp_path, demand__pairs=0, demand__keep=[0.75, 0.5])
    invoke("demand", str(spec))
    reference = tmp_path / "run" / "reference"
    assert loads.count(reference) == 1  # probed, then cut: one load
    invoke("demand", str(spec), "--from", "probe")
    assert loads.count(reference) == 2


def test_demand_without_probing_is_the_demand_after_probing(tmp_path: Path) -> None:
    """With nothing measured and [diagnose] off the probe stage does not run (nothing reads its
    clouds), yet the demand stage measures the same cuts: its compute key and its numbers equal
    those of the same spec whose probe runs for a measured profile."""
    measured_block = (
        '[[measure]]\ngeometry = { kind = "spherical" }\nstatistic = { kind = "shift" }\n'
    )
    assert measured_block in SPEC
    bare = SPEC.replace(measured_block, "").replace(
        "probe_only = true\n", "probe_only = true\nmeasure = []\n"
    )
    records = {}
    for name, text in (("probed", SPEC), ("bare", bare)):
        directory = tmp_path / name
        directory.mkdir()
        invoke("demand", str(write_spec(directory, text, demand__pairs=0)))
        run = directory / "run"
        assert (run / "clouds").exists() == (name == "probed")
        records[name] = json.loads((run / "demand.json").read_text())
    probed, bare_record = records["probed"], records["bare"]
    assert bare_record["keys"]["compute"] == probed["keys"]["compute"]
    assert bare_record["layers"] == probed["layers"] and bare_record["orders"] == probed["orders"]
