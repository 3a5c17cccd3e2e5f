"""Tokenizers: a byte-level BPE trained on the training split, GPT-2's BPE, or a pretrained one.

Every kind ends as a ``tokenizers.Tokenizer`` saved as ``tokenizer.json`` beside the packed tokens,
so a prepared dataset always carries the exact tokenizer that produced it. Documents are separated
by an end-of-text token (``<|endoftext|>`` for bpe and gpt2, the tokenizer's EOS otherwise).
"""

from __future__ import annotations

from collections.abc import Iterable
from importlib import resources
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from geospec.errors import UsageError
from geospec.hub import Source, check_hub_files, locate
from geospec.spec.sections import BPETokenizer, GPT2Tokenizer, PretrainedTokenizer

EOT = "<|endoftext|>"
TokenizerSpec = BPETokenizer | GPT2Tokenizer | PretrainedTokenizer


def bundled_gpt2_dir() -> Path:
    """The GPT-2 vocab.json and merges.txt shipped inside the package."""
    return Path(str(resources.files("geospec") / "data" / "gpt2"))


def _byte_level(model: models.Model) -> Tokenizer:
    tokenizer = Tokenizer(model)
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def gpt2_tokenizer(directory: Path | None = None) -> Tokenizer:
    """GPT-2's byte-level BPE from ``vocab.json`` and ``merges.txt`` (bundled copy by default)."""
    directory = directory or bundled_gpt2_dir()
    vocab, merges = directory / "vocab.json", directory / "merges.txt"
    for path in (vocab, merges):
        if not path.is_file():
            raise UsageError(
                f"data.tokenizer.path: {path} not found; the directory must hold vocab.json and "
                "merges.txt (omit path to use the bundled GPT-2 files)"
            )
    tokenizer = _byte_level(models.BPE.from_file(str(vocab), str(merges)))
    tokenizer.add_special_tokens([EOT])
    return tokenizer


def train_bpe(spec: BPETokenizer, texts: Iterable[str]) -> Tokenizer:
    """A byte-level BPE with ``spec.vocab_size`` entries (EOT first, then the 256 byte symbols)."""
    tokenizer = _byte_level(models.BPE())
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        min_frequency=spec.min_frequency,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def pretrained_tokenizer(
    source: Source | Path, trust_remote_code: bool = False
) -> tuple[Tokenizer, int]:
    """The fast tokenizer of a pretrained model (a local directory, the tokenizer embedded in a
    ``.gguf`` file, or a hub id at its commit) and its EOS id, which separates documents. Code
    shipped with the tokenizer runs only with ``trust_remote_code``."""
    from transformers import AutoTokenizer

    if not isinstance(source, Source):
        source = locate(str(source), None, Path.cwd(), "data.tokenizer.path")
    location, keywords = source.from_pretrained_args()
    try:
        loaded = AutoTokenizer.from_pretrained(
            location, trust_remote_code=trust_remote_code, **keywords
        )
    except Exception as error:  # transformers raises many kinds; each is the user's file
        if source.on_hub:  # a wrong id or commit, or one missing from the cache, said plainly
            check_hub_files(source, "tokenizer_config.json")
        raise UsageError(
            f"data.tokenizer.path: cannot load a tokenizer from {source}: {load_error(error)}"
            + _gguf_hint(source)
        ) from None
    backend = getattr(loaded, "backend_tokenizer", None)
    if not isinstance(backend, Tokenizer):
        raise UsageError(
            f"data.tokenizer.path: {source} has no fast tokenizer (tokenizer.json); convert it "
            "with transformers (AutoTokenizer.from_pretrained(...).save_pretrained(...)) first"
        )
    if loaded.eos_token_id is None:
        raise UsageError(
            f"data.tokenizer.path: the tokenizer in {source} has no EOS token to separate documents"
        )
    return backend, int(loaded.eos_token_id)


def build_tokenizer(
    spec: TokenizerSpec, train_texts: Iterable[str], spec_dir: Path | None
) -> tuple[Tokenizer, int]:
    """The tokenizer a spec names and its end-of-text id; ``train_texts`` is read only when a BPE
    must be trained. Relative paths are taken from ``spec_dir`` (default: the working directory)."""
    base = spec_dir or Path.cwd()
    if isinstance(spec, PretrainedTokenizer):
        source = locate(spec.path, spec.revision, base, "data.tokenizer.path")
        return pretrained_tokenizer(source, spec.trust_remote_code)
    if isinstance(spec, GPT2Tokenizer):
        tokenizer = gpt2_tokenizer(base / spec.path if spec.path else None)
    else:
        tokenizer = train_bpe(spec, train_texts)
    eot = tokenizer.token_to_id(EOT)
    assert eot is not None  # both kinds register EOT as a special token
    return tokenizer, eot


def _gguf_hint(source: Source) -> str:
    """A directory holding only a GGUF file has no tokenizer files: its tokenizer is in the file."""
    if source.on_hub or source.gguf_file or not source.path.is_dir():
        return ""
    gguf = sorted(p.name for p in source.path.glob("*.gguf"))
    return (
        f' (the tokenizer of a GGUF checkpoint is inside it: path = "{source.path / gguf[0]}")'
        if gguf
        else ""
    )


def load_error(error: BaseException) -> str:
    """One line about why transformers could not load a checkpoint or tokenizer."""
    text = " ".join(str(error).split()) or type(error).__name__
    if "trust_remote_code" in text:
        return (
            "it ships its own Python code (auto_map), which geospec does not run unless told to; "
            "set trust_remote_code = true only if you trust its source"
        )
    return text if len(text) <= 300 else text[:297] + "..."


def vocab_size(tokenizer: Tokenizer) -> int:
    """One more than the largest id the tokenizer can produce (added tokens included)."""
    return max(tokenizer.get_vocab(with_added_tokens=True).values()) + 1
