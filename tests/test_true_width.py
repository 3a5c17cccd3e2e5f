"""True-width exports of pruned models (geospec.prune.true_width): the saved tensors have each
layer's own FFN width, geospec.load_pruned reads them back as a plain transformers model, and
that model computes what the padded export computes when plain AutoModelForCausalLM loads it."""

from __future__ import annotations

import json
from pathlib import Path

import hf_models
import pytest
import torch
import transformers as hf
from safetensors import safe_open

import geospec
from geospec.errors import OutOfSpace, UsageError
from geospec.measure.probe import find_ffn_sites
from geospec.measure.sensitivity import logits_of
from geospec.prune import true_width
from geospec.prune.cut import pruned
from geospec.prune.hf_export import export_pruned

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_torch_thread")]

IDS = torch.randint(0, hf_models.VOCAB, (2, 15), generator=torch.Generator().manual_seed(1))


def pruned_exports(family: str, tmp_path: Path) -> tuple[list[int], Path, Path]:
    """The family's tiny model cut to uneven widths (each layer keeping a different set of
    neurons), exported at its true widths and padded."""
    model = hf_models.llama() if family == "llama" else hf_models.gpt2()
    sites = find_ffn_sites(model, hf_models.WIDTH, lambda: logits_of(model, IDS[:1]))
    full = 80 if family == "llama" else 4 * hf_models.WIDTH
    widths = [full // 4, full, full // 2 + 8]
    generator = torch.Generator().manual_seed(2)
    orders = [torch.randperm(full, generator=generator).tolist() for _ in sites]
    with torch.no_grad(), pruned(sites, orders, widths):
        export_pruned(model, sites, widths, tmp_path / "true")
        export_pruned(model, sites, widths, tmp_path / "padded", padded=True)
    return widths, tmp_path / "true", tmp_path / "padded"


def tensor_shapes(directory: Path) -> dict[str, list[int]]:
    with safe_open(str(directory / "model.safetensors"), "pt") as file:
        return {name: list(file.get_slice(name).get_shape()) for name in file.keys()}  # noqa: SIM118


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_the_true_width_model_computes_the_padded_export_and_holds_only_its_widths(
    family: str, tmp_path: Path
) -> None:
    widths, true_dir, padded_dir = pruned_exports(family, tmp_path)
    model = geospec.load_pruned(true_dir)
    expected = {"llama": hf.LlamaForCausalLM, "gpt2": hf.GPT2LMHeadModel}[family]
    assert type(model) is expected  # the config's own class: no remote code
    reference = hf.AutoModelForCausalLM.from_pretrained(padded_dir).eval()
    with torch.no_grad():
        ours, theirs = model(IDS).logits, reference(IDS).logits
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=1e-6)

    # the file holds the true shapes: each layer's projections at its own width
    shapes = tensor_shapes(true_dir)
    d = hf_models.WIDTH
    for layer, width in enumerate(widths):
        if family == "llama":
            prefix = f"model.layers.{layer}.mlp."
            assert shapes[prefix + "gate_proj.weight"] == [width, d]
            assert shapes[prefix + "up_proj.weight"] == [width, d]
            assert shapes[prefix + "down_proj.weight"] == [d, width]
        else:  # Conv1D: in x out
            prefix = f"transformer.h.{layer}.mlp."
            assert shapes[prefix + "c_fc.weight"] == [d, width]
            assert shapes[prefix + "c_fc.bias"] == [width]
            assert shapes[prefix + "c_proj.weight"] == [width, d]
    in_file = sum(torch.Size(shape).numel() for shape in shapes.values())
    assert sum(p.numel() for p in model.parameters()) == in_file
    # by hand: the padded file has (max - w) more units per layer, each 3d (gate row, up row,
    # down column) in Llama; GPT-2's is a c_fc column, its bias and a c_proj row (2d + 1)
    per_unit = 3 * d if family == "llama" else 2 * d + 1
    padded_file = sum(torch.Size(s).numel() for s in tensor_shapes(padded_dir).values())
    assert padded_file - in_file == sum(max(widths) - w for w in widths) * per_unit
    assert sum(p.numel() for p in reference.parameters()) == padded_file
    config = json.loads((true_dir / "config.json").read_text())
    assert config["geospec"]["ffn_widths"] == widths and config["geospec"]["padded_to"] is None
    assert config["intermediate_size" if family == "llama" else "n_inner"] == max(widths)
    # the padded export read by load_pruned drops its zero units: the true-width model again
    unpadded = geospec.load_pruned(padded_dir)
    assert sum(p.numel() for p in unpadded.parameters()) == in_file
    with torch.no_grad():
        torch.testing.assert_close(unpadded(IDS).logits, ours, atol=1e-6, rtol=1e-6)


def test_the_export_says_what_padding_costs(tmp_path: Path) -> None:
    model = hf_models.llama()
    sites = find_ffn_sites(model, hf_models.WIDTH, lambda: logits_of(model, IDS[:1]))
    widths = [16, 80, 40]
    orders = [list(range(80))] * 3
    with torch.no_grad(), pruned(sites, orders, widths):
        true = export_pruned(model, sites, widths, tmp_path / "true")
        padded = export_pruned(model, sites, widths, tmp_path / "padded", padded=True)
    extra = (80 - 16 + 80 - 40) * 3 * hf_models.WIDTH  # 104 units of 3 x 32
    assert padded.parameters - true.parameters == extra
    assert true.padded_parameters == padded.parameters and padded.true_parameters == true.parameters
    for note in (true.note, padded.note):
        assert "\n" not in note and f"costs {extra:,} parameters" in note
    assert padded.note.startswith("stored padded") and true.note.startswith("stored at the true")


def test_generate_runs_on_the_true_width_model_as_on_the_padded_one(tmp_path: Path) -> None:
    _, true_dir, padded_dir = pruned_exports("llama", tmp_path)
    model = geospec.load_pruned(true_dir)
    reference = hf.AutoModelForCausalLM.from_pretrained(padded_dir).eval()
    prompt = IDS[:1, :5]
    ours = model.generate(prompt, max_new_tokens=8, do_sample=False, pad_token_id=2)
    theirs = reference.generate(prompt, max_new_tokens=8, do_sample=False, pad_token_id=2)
    assert ours.shape == (1, 13) and ours.tolist() == theirs.tolist()


def test_peft_lora_wraps_the_true_width_projections(tmp_path: Path) -> None:
    """LoRA on every MLP projection: the adapters take each layer's true width, the untrained
    adapter changes nothing (its B is zero), and one optimiser step on it changes the logits."""
    peft = pytest.importorskip("peft", reason="pip install peft")
    widths, true_dir, _ = pruned_exports("llama", tmp_path)
    model = geospec.load_pruned(true_dir)
    with torch.no_grad():
        before = model(IDS).logits
    config = peft.LoraConfig(r=4, target_modules=["gate_proj", "up_proj", "down_proj"])
    wrapped = peft.get_peft_model(model, config)
    for layer, width in enumerate(widths):
        mlp = wrapped.base_model.model.model.layers[layer].mlp
        assert mlp.gate_proj.lora_B["default"].weight.shape == (width, 4)
        assert mlp.down_proj.lora_A["default"].weight.shape == (4, width)
    with torch.no_grad():
        torch.testing.assert_close(wrapped(IDS).logits, before)
    trainable = [p for p in wrapped.parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n, p in wrapped.named_parameters() if p.requires_grad)
    optimizer = torch.optim.SGD(trainable, lr=0.5)
    loss = wrapped(input_ids=IDS, labels=IDS).loss
    loss.backward()
    optimizer.step()
    with torch.no_grad():
        assert (wrapped(IDS).logits - before).abs().max() > 1e-4


def test_a_directory_without_the_width_record_is_one_line_naming_its_config(
    tmp_path: Path,
) -> None:
    plain = tmp_path / "plain"
    hf_models.llama().save_pretrained(plain)
    with pytest.raises(UsageError) as caught:
        geospec.load_pruned(plain)
    message = str(caught.value)
    assert caught.value.exit_code == 2 and "\n" not in message
    assert str(plain / "config.json") in message and "geospec.ffn_widths" in message
    assert "AutoModelForCausalLM.from_pretrained" in message  # the fix for a foreign checkpoint
    with pytest.raises(UsageError, match=r"config\.json: not found"):
        geospec.load_pruned(tmp_path)


def test_widths_that_disagree_with_the_tensors_are_refused(tmp_path: Path) -> None:
    widths, true_dir, padded_dir = pruned_exports("llama", tmp_path)
    config_file = true_dir / "config.json"
    config = json.loads(config_file.read_text())
    config["geospec"]["ffn_widths"] = [widths[0] + 8, *widths[1:]]  # more than the file holds
    config_file.write_text(json.dumps(config))
    with pytest.raises(UsageError, match="disagree with the tensors"):
        geospec.load_pruned(true_dir)
    # a padded file whose "padding" is not zero: the recorded width is not the live one
    config = json.loads((padded_dir / "config.json").read_text())
    config["geospec"]["ffn_widths"] = [widths[0], widths[1], widths[2] - 8]
    (padded_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(UsageError, match="non-zero units"):
        geospec.load_pruned(padded_dir)


def test_an_export_is_all_or_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure while the weights are written leaves no directory and no staging directory;
    an existing non-empty directory is refused before anything is written."""
    model = hf_models.llama()
    sites = find_ffn_sites(model, hf_models.WIDTH, lambda: logits_of(model, IDS[:1]))

    def full_disk(model: object, path: Path, extra: object, dtype: object) -> None:
        path.write_bytes(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(true_width, "_save_weights", full_disk)
    with torch.no_grad(), pytest.raises(OutOfSpace):
        export_pruned(model, sites, [80, 80, 80], tmp_path / "out")
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "file").write_text("mine")
    with pytest.raises(UsageError, match="not empty"):
        export_pruned(model, sites, [80, 80, 80], tmp_path / "taken")
    assert [p.name for p in (tmp_path / "taken").iterdir()] == ["file"]


@pytest.mark.parametrize("padded", [False, True], ids=["true-width", "padded"])
def test_a_quantised_sources_config_is_not_carried_into_the_export(
    padded: bool, tmp_path: Path
) -> None:
    """A GGUF source leaves transformers' GgufConfig (quant_method gguf) on the model's config;
    the export's weights are the de-quantised tensors, so its config.json names no quantisation
    and plain transformers loads it without looking for a GGUF file."""
    model = hf_models.llama()
    model.config.quantization_config = hf.GgufConfig(gguf_file="model.gguf")
    sites = find_ffn_sites(model, hf_models.WIDTH, lambda: logits_of(model, IDS[:1]))
    widths = [40, 40, 40]  # one width: AutoModelForCausalLM reads the true-width export too
    with torch.no_grad(), pruned(sites, [list(range(80))] * 3, widths):
        expected = model(IDS).logits
        export_pruned(model, sites, widths, tmp_path / "out", padded=padded)
    assert "quantization_config" not in json.loads((tmp_path / "out" / "config.json").read_text())
    assert model.config.quantization_config is not None  # the live model's config is its own
    loaded = hf.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(IDS).logits, expected, atol=1e-6, rtol=1e-6)
