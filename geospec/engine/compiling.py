"""torch.compile for a training run, without a silent fall-back to eager.

Dynamo keeps a bounded number of compiled versions of each function (``recompile_limit``, 8 by
default) and treats parameter shapes as static. Every distinct FFN width is a new version of a
block's forward, and train and eval mode are two versions of each; past the limit Dynamo runs the
function uncompiled, with one warning in the log. A tapered 12-layer model compiled block by
block (FSDP2) has up to 12 widths, and ``geospec run`` trains every arm in one process, so the
graphs of earlier arms would use up the limit of later ones.

So each run starts from an empty compile cache (:func:`compile_for_training`), the limit is raised
to what the run's distinct shapes need, and hitting it anyway is an error
(:func:`recompile_limit`), never a slow arm. ``GEOSPEC_COMPILE_BACKEND`` picks another backend
than inductor (``eager`` or ``aot_eager`` to tell a compiler bug from a model bug; the CPU tests
use ``eager``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from geospec.errors import GeospecError

BACKEND_ENV = "GEOSPEC_COMPILE_BACKEND"
#: Dynamo's own default limit; never lowered below it.
DEFAULT_LIMIT = 8
#: Compiled versions one shape may need: train, eval, eval on a shorter last batch (dynamic
#: batch), and one to spare.
VERSIONS_PER_SHAPE = 4

Backend = str | Callable[..., Any]


def compile_backend() -> str:
    """The backend torch.compile uses: ``$GEOSPEC_COMPILE_BACKEND``, else inductor."""
    return os.environ.get(BACKEND_ENV) or "inductor"


def compile_for_training(model: nn.Module, per_block: bool, backend: Backend | None = None) -> int:
    """Compile ``model`` whole (one process, DDP) or each of its ``blocks`` (FSDP2) from an empty
    compile cache; returns the recompile limit the run needs (see :func:`recompile_limit`).

    The cache is emptied because compiled versions of the shared code (``Block.forward``,
    ``GPT.forward``) made for earlier runs in this process count against the limit.
    """
    import torch._dynamo  # not imported by `import torch` itself

    torch._dynamo.reset()
    targets: list[nn.Module] = list(getattr(model, "blocks", [])) if per_block else [model]
    for target in targets:
        target.compile(backend=backend or compile_backend())
    shapes = {tuple(tuple(p.shape) for p in target.parameters()) for target in targets}
    return max(DEFAULT_LIMIT, VERSIONS_PER_SHAPE * len(shapes))


def _config_names() -> tuple[str, str | None]:
    """Dynamo's names of the limit and of its fail switch (renamed in torch 2.7)."""
    import torch._dynamo

    config = torch._dynamo.config
    limit = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    for fail in ("fail_on_recompile_limit_hit", "fail_on_cache_limit_hit"):
        if hasattr(config, fail):
            return limit, fail
    return limit, None


@contextlib.contextmanager
def recompile_limit(limit: int | None) -> Iterator[None]:
    """Dynamo's recompile limit is ``limit`` inside the block, and hitting it raises
    :class:`GeospecError` instead of running uncompiled (restored on exit). ``None``: nothing is
    compiled, nothing changes."""
    if limit is None:
        yield
        return
    import torch._dynamo.exc as dynamo_errors

    limit_name, fail_name = _config_names()
    settings: dict[str, Any] = {limit_name: limit}
    if fail_name is not None:
        settings[fail_name] = True
    limit_hit = tuple(
        getattr(dynamo_errors, name)
        for name in ("FailOnRecompileLimitHit", "FailOnCacheLimitHit")
        if hasattr(dynamo_errors, name)
    )
    try:
        with torch._dynamo.config.patch(settings):
            yield
    except limit_hit as error:
        raise GeospecError(
            f"torch.compile hit its recompile limit ({limit} compiled versions of one function): "
            "this run would have trained uncompiled. Set train.compile = false to train without "
            f"compiling, and report the shapes that recompiled ({error})"
        ) from error
