"""Which token windows each training step and each evaluation reads.

The packed training tokens are cut into non-overlapping windows of ``seq_len + 1`` tokens (inputs
and next-token targets; consecutive windows share one boundary token). Training reads the windows
in a seeded permutation per epoch, so the sequence with global index i depends only on the seed
and i: every arm with the same seed sees the same data in the same order, a resumed run continues
exactly where it stopped, and the global batch is the same whatever the number of processes.
Evaluation reads the first windows of the validation tokens, identical for every run.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from geospec.errors import UsageError


def window_count(n_tokens: int, seq_len: int) -> int:
    return max(0, (n_tokens - 1) // seq_len)


class TrainOrder:
    """Global sequence index -> training window: a seeded permutation of all windows per epoch."""

    def __init__(self, n_tokens: int, seq_len: int, seed: int) -> None:
        self.n_windows = window_count(n_tokens, seq_len)
        if self.n_windows == 0:
            raise UsageError(
                f"the training split has {n_tokens} tokens, fewer than model.seq_len + 1 = "
                f"{seq_len + 1}; use more data or a shorter seq_len"
            )
        self.seed = seed
        self._epoch = -1
        self._permutation = np.empty(0, dtype=np.int64)

    def _epoch_order(self, epoch: int) -> np.ndarray:
        if epoch != self._epoch:
            rng = np.random.default_rng([self.seed, epoch])
            self._permutation = rng.permutation(self.n_windows)
            self._epoch = epoch
        return self._permutation

    def windows(self, start: int, count: int) -> np.ndarray:
        """Windows read by global sequence indices ``start .. start + count - 1``."""
        out = np.empty(count, dtype=np.int64)
        done = 0
        while done < count:
            epoch, offset = divmod(start + done, self.n_windows)
            take = min(count - done, self.n_windows - offset)
            out[done : done + take] = self._epoch_order(epoch)[offset : offset + take]
            done += take
        return out


def window_batch(
    tokens: np.ndarray, windows: np.ndarray, seq_len: int, out: torch.Tensor | None = None
) -> torch.Tensor:
    """The given windows as one int64 tensor of windows x (seq_len + 1) tokens: inputs are
    ``[:, :-1]``, next-token targets ``[:, 1:]``. Written into ``out`` (a CPU tensor) if given."""
    index = windows[:, None] * seq_len + np.arange(seq_len + 1)
    if out is None:
        return torch.from_numpy(np.asarray(tokens[index], dtype=np.int64))
    out.numpy()[...] = tokens[index]
    return out


def window_tensors(
    tokens: np.ndarray, windows: np.ndarray, seq_len: int, bos: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets (each windows x seq_len, int64) of the given windows.

    With ``bos`` (a tokenizer that starts every text with it: ``TokenData.bos_id``) each window's
    inputs start with it and its first token is predicted from it: window k still scores
    seq_len tokens, those from ``k x seq_len`` on, each text token of the windows exactly once."""
    chunk = window_batch(tokens, windows, seq_len)
    if bos is None:
        return chunk[:, :-1], chunk[:, 1:]
    return with_bos(chunk[:, :-2], bos), chunk[:, :-1]


def with_bos(ids: torch.Tensor, bos: int | None) -> torch.Tensor:
    """Windows of token ids (windows x n) with ``bos`` put before each (windows x (n + 1)); the
    same tensor when ``bos`` is None."""
    if bos is None:
        return ids
    return torch.cat([ids.new_full((len(ids), 1), bos), ids], dim=1)


def input_windows(
    tokens: np.ndarray, starts: Sequence[int] | np.ndarray, seq_len: int, bos: int | None = None
) -> torch.Tensor:
    """The model inputs of the windows of ``seq_len`` tokens at ``starts`` (windows x seq_len,
    int64): with ``bos``, each starts with it and holds the window's first seq_len - 1 tokens,
    as :func:`window_tensors` feeds them."""
    length = seq_len if bos is None else seq_len - 1
    ids = torch.from_numpy(np.stack([tokens[s : s + length].astype(np.int64) for s in starts]))
    return with_bos(ids, bos)


class StepBatches:
    """Each training step's sequences for this process, as one tensor on the device.

    Step s reads the global sequences ``s * batch_size + first`` onwards, ``count`` of them (this
    process's share; the caller slices it into micro-batches on the device). On CUDA they are
    gathered into one pinned buffer and copied in one non-blocking transfer, and (``prefetch``,
    default on CUDA) the next step's batch is gathered and its copy queued when a step's batch is
    handed out, so the host work overlaps the GPU's. The values never depend on either.
    """

    def __init__(
        self,
        tokens: np.ndarray,
        order: TrainOrder,
        seq_len: int,
        batch_size: int,
        first: int,
        count: int,
        steps: int,
        device: torch.device,
        prefetch: bool | None = None,
    ) -> None:
        self.tokens, self.order, self.seq_len = tokens, order, seq_len
        self.batch_size, self.first, self.count, self.steps = batch_size, first, count, steps
        self.device = device
        self.prefetch = device.type == "cuda" if prefetch is None else prefetch
        self._ahead: tuple[int, torch.Tensor] | None = None

    def _load(self, step: int) -> torch.Tensor:
        windows = self.order.windows(step * self.batch_size + self.first, self.count)
        if self.device.type != "cuda":
            return window_batch(self.tokens, windows, self.seq_len).to(self.device)
        pinned = torch.empty((self.count, self.seq_len + 1), dtype=torch.int64, pin_memory=True)
        window_batch(self.tokens, windows, self.seq_len, out=pinned)
        # the caching host allocator keeps the pinned block until this copy has completed
        return pinned.to(self.device, non_blocking=True)

    def get(self, step: int) -> torch.Tensor:
        """Step ``step``'s batch (count x (seq_len + 1) token ids on the device)."""
        ahead, self._ahead = self._ahead, None
        batch = ahead[1] if ahead is not None and ahead[0] == step else self._load(step)
        if self.prefetch and step + 1 < self.steps:
            self._ahead = (step + 1, self._load(step + 1))
        return batch


def validation_windows(n_tokens: int, seq_len: int, eval_tokens: int | None) -> np.ndarray:
    """The first windows of the validation split covering ``eval_tokens`` (default: all)."""
    available = window_count(n_tokens, seq_len)
    if available == 0:
        raise UsageError(
            f"the validation split has {n_tokens} tokens, fewer than model.seq_len + 1 = "
            f"{seq_len + 1}; raise data.val_fraction or use more data"
        )
    wanted = available if eval_tokens is None else max(1, eval_tokens // seq_len)
    return np.arange(min(available, wanted), dtype=np.int64)
