"""torch.compile in training never falls back to eager: each run compiles from an empty cache with
room for its widths, and a recompile limit that is hit anyway is an error.

The backend below is Dynamo's "eager" backend with a counter: it records every graph Dynamo
compiles and every call that runs one, so a forward that fell back to eager shows up as a call
that was not counted.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from geospec.engine.batches import validation_windows
from geospec.engine.compiling import BACKEND_ENV, compile_for_training, recompile_limit
from geospec.engine.model import GPT, GPTConfig
from geospec.engine.token_data import prepare_data
from geospec.engine.train import train_model
from geospec.errors import GeospecError
from geospec.spec.sections import DataSpec, TrainSpec

pytestmark = pytest.mark.torch

TAPERED = [80, 72, 64, 56, 48]  # 5 widths: 10 versions of a block (train, eval) > 8


class Counting:
    """Dynamo's eager backend, counting compiled graphs and the calls that run them."""

    def __init__(self) -> None:
        self.graphs = 0
        self.calls = 0

    def __call__(self, graph: torch.fx.GraphModule, inputs: Any) -> Callable[..., Any]:
        self.graphs += 1

        def run(*args: Any) -> Any:
            self.calls += 1
            return graph.forward(*args)

        return run


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def tiny(widths: list[int]) -> GPT:
    torch.manual_seed(0)
    config = GPTConfig(
        vocab_size=32, n_layers=len(widths), d_model=16, n_heads=2, seq_len=8, ffn_widths=widths
    )
    return GPT(config)


def train_and_evaluate(model: GPT) -> None:
    """What a training run calls: a training step, then an evaluation."""
    tokens = torch.randint(0, 32, (2, 9))
    _, loss = model(tokens[:, :-1], tokens[:, 1:])
    assert loss is not None
    loss.backward()
    model.eval()
    with torch.no_grad():
        model(tokens[:, :-1], tokens[:, 1:])
    model.train()


@pytest.mark.slow
def test_every_arm_trained_in_one_process_runs_compiled() -> None:
    """DDP style (the whole model compiled): five arms in a row, as `geospec run` trains them.
    Without a fresh cache per run the fifth arm's graphs would be versions 9 and 10."""
    arms = [[64, 64], [80, 48], [48, 80], [96, 32], [32, 96]]
    for widths in arms:
        backend = Counting()
        model = tiny(widths)
        limit = compile_for_training(model, per_block=False, backend=backend)
        with recompile_limit(limit):
            train_and_evaluate(model)
        assert backend.calls == 2  # every forward ran a compiled graph
        assert backend.graphs == 2  # train and eval


def test_per_block_compile_has_room_for_every_width() -> None:
    """FSDP2 style (each block compiled): every distinct width is a version of Block.forward."""
    backend = Counting()
    model = tiny(TAPERED)
    limit = compile_for_training(model, per_block=True, backend=backend)
    assert limit >= 2 * len(set(TAPERED))
    with recompile_limit(limit):
        train_and_evaluate(model)
    assert backend.calls == 2 * len(TAPERED)  # no block fell back to eager
    assert backend.graphs == 2 * len(set(TAPERED))
    # the same run under Dynamo's default limit (8) would train some blocks uncompiled: an error
    model = tiny(TAPERED)
    compile_for_training(model, per_block=True, backend=Counting())
    hit = r"recompile limit \(8 .*trained uncompiled"
    with pytest.raises(GeospecError, match=hit), recompile_limit(8):
        train_and_evaluate(model)


NAMED = Counting()
torch._dynamo.register_backend(NAMED, name="geospec_test_counting")


def test_train_model_compiles_every_forward_of_every_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The engine itself (train.compile = true; the backend from GEOSPEC_COMPILE_BACKEND): three
    runs in one process, each with every training and evaluation forward compiled."""
    monkeypatch.setenv(BACKEND_ENV, "geospec_test_counting")
    data = prepare_data(
        DataSpec(
            source="bundled:austen", max_documents=20, tokenizer={"kind": "bpe", "vocab_size": 300}
        ),
        tmp_path / "data",
    )
    train = TrainSpec(
        steps=4, batch_size=4, micro_batch_size=2, eval_interval=2, eval_tokens=5 * 16,
        checkpoint_interval=4, log_interval=2, compile=True, threads=1,
    )  # fmt: skip
    windows = validation_windows(len(data.val), 16, train.eval_tokens)
    eval_calls = math.ceil(len(windows) / 2)
    for index, widths in enumerate(([48] * 3, [64, 48, 32], [32, 48, 64])):
        NAMED.calls = NAMED.graphs = 0
        config = GPTConfig(
            vocab_size=data.vocab_size, n_layers=3, d_model=16, n_heads=2, seq_len=16,
            ffn_widths=widths,
        )  # fmt: skip
        train_model(train, config, data, tmp_path / f"run{index}", seed=0, progress=False)
        assert NAMED.calls == 4 * 2 + 2 * eval_calls  # steps x micro-batches + 2 evaluations
        assert NAMED.graphs <= 3
