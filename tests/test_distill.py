"""Distillation (geospec.engine.distill): the KL term against a hand computation, the teacher in
a training run's identity, and healing a pruned model towards the unpruned one."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from geospec.engine.checkpoint import load_model
from geospec.engine.distill import Teacher, kl_per_token
from geospec.engine.identity import weights_digest
from geospec.engine.model import GPT, GPTConfig
from geospec.engine.token_data import prepare_data
from geospec.engine.train import train_model
from geospec.errors import GeospecError
from geospec.spec.loading import load_spec
from geospec.spec.sections import PruneHeal, TrainSpec

pytestmark = pytest.mark.torch


def hand_kl(student: np.ndarray, teacher: np.ndarray, t: float) -> float:
    """T^2 x mean over rows of sum_v p_v log(p_v / q_v), p = softmax(teacher / T), q of the
    student, in float64."""

    def softmax(z: np.ndarray) -> np.ndarray:
        e = np.exp(z / t - (z / t).max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    p = softmax(teacher.reshape(-1, teacher.shape[-1]).astype(np.float64))
    q = softmax(student.reshape(-1, student.shape[-1]).astype(np.float64))
    return float(t * t * (p * np.log(p / q)).sum(axis=-1).mean())


@pytest.mark.parametrize("temperature", [1.0, 2.5])
def test_kl_per_token_is_the_mean_token_kl_from_the_teacher(temperature: float) -> None:
    generator = torch.Generator().manual_seed(0)
    student = torch.randn(3, 5, 11, generator=generator) * 3
    teacher = torch.randn(3, 5, 11, generator=generator) * 3
    found = float(kl_per_token(student, teacher, temperature))
    assert found == pytest.approx(hand_kl(student.numpy(), teacher.numpy(), temperature), 1e-5)
    assert float(kl_per_token(teacher, teacher, temperature)) == pytest.approx(0.0, abs=1e-6)


def tiny_gpt(seed: int) -> GPT:
    torch.manual_seed(seed)
    config = GPTConfig(
        vocab_size=40, n_layers=2, d_model=16, n_heads=2, seq_len=8, ffn_widths=[24, 24],
        tie_embeddings=False,
    )  # fmt: skip
    return GPT(config).eval()


def test_the_loss_mixes_cross_entropy_and_kl_by_weight() -> None:
    student, teacher_model = tiny_gpt(0), tiny_gpt(1)
    ids = torch.randint(0, 40, (2, 8), generator=torch.Generator().manual_seed(3))
    targets = torch.roll(ids, -1, dims=1)
    logits, ce = student(ids, targets)
    assert ce is not None
    with torch.no_grad():
        reference, _ = teacher_model(ids)
    kl = hand_kl(logits.detach().numpy(), reference.numpy(), 1.0)
    for weight in (1.0, 0.25):
        teacher = Teacher(teacher_model, "x", weight)
        found = float(teacher.loss(ids, logits, ce).detach())
        assert found == pytest.approx((1 - weight) * float(ce) + weight * kl, rel=1e-5)
    with pytest.raises(ValueError, match="weight"):
        Teacher(teacher_model, "x", 0.0)


def test_distilling_moves_the_student_towards_the_teacher_and_names_it(tmp_path: Path) -> None:
    """A student trained on the KL alone ends nearer its teacher than it started (on text it
    never trained on); the teacher is in the run's fingerprint, and a directory refuses to
    resume under another teacher."""
    corpus = tmp_path / "docs.txt"
    words = [
        "the",
        "cat",
        "sat",
        "on",
        "a",
        "mat",
        "and",
        "the",
        "dog",
        "ran",
        "to",
        "the",
        "park",
        "while",
        "a",
        "bird",
        "sang",
    ]
    rng = np.random.default_rng(0)
    corpus.write_text("\n\n".join(" ".join(rng.choice(words, 60)) for _ in range(40)))
    spec_file = tmp_path / "spec.toml"
    spec_file.write_text(
        'name = "d"\nout = "run"\n[model]\nn_layers = 2\nd_model = 16\nn_heads = 2\n'
        "ffn_width = 24\nseq_len = 8\nmultiple_of = 8\n[data]\n"
        'files = ["docs.txt"]\ntokenizer = { kind = "bpe", vocab_size = 300 }\n'
        '[[arms]]\nname = "u"\nschedule = { kind = "uniform" }\n[train]\nsteps = 1\n'
    )
    spec = load_spec(spec_file)
    data = prepare_data(spec.data, tmp_path / "data", spec_dir=tmp_path)
    config = GPTConfig(
        vocab_size=data.vocab_size, n_layers=2, d_model=16, n_heads=2, seq_len=8,
        ffn_widths=[24, 24],
    )  # fmt: skip
    torch.manual_seed(1)
    teacher_model, student = GPT(config).eval(), GPT(config)
    teacher = Teacher(teacher_model, weights_digest(teacher_model.state_dict()), 1.0)
    initial = {k: v.clone() for k, v in student.state_dict().items()}
    val = torch.as_tensor(data.val[: 8 * 16 + 1].astype(np.int64))
    windows = val[: 8 * 16].reshape(16, 8)

    def distance(model: GPT) -> float:
        with torch.no_grad():
            return float(kl_per_token(model.eval()(windows)[0], teacher_model(windows)[0]))

    before = distance(student)
    train = TrainSpec(steps=60, batch_size=8, lr=3e-3, warmup=0, device="cpu", eval_tokens=64)
    out = tmp_path / "student"
    train_model(train, config, data, out, seed=0, progress=False, initial=initial, teacher=teacher)
    result = json.loads((out / "result.json").read_text())
    assert result["fingerprint"]["teacher"] == teacher.identity()
    assert distance(load_model(out, torch.device("cpu"))) < 0.5 * before
    other = Teacher(GPT(config), "another-teacher", 1.0)
    with pytest.raises(GeospecError):
        train_model(train, config, data, out, seed=0, progress=False, initial=initial,
                    teacher=other)  # fmt: skip


def test_heal_distill_is_a_share_in_zero_to_one() -> None:
    assert PruneHeal(steps=2, distill=1.0).distill == 1.0
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match="distill"):
            PruneHeal(steps=2, distill=bad)
