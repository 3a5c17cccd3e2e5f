"""Reading a spec file: TOML syntax, validation and cross-checks, each problem one clear line."""

from __future__ import annotations

import difflib
import itertools
import re
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tomlkit
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from tomlkit.exceptions import KeyAlreadyPresent, ParseError

from geospec.errors import SpecError
from geospec.hub import spec_path
from geospec.plugin import PluginTable
from geospec.spec.checks import cross_check
from geospec.spec.sections import Spec

MAX_SPEC_BYTES = 1_000_000


def shipped_specs() -> dict[str, Path]:
    """The example specs shipped inside geospec (``geospec.specs``), by name (``tiny``)."""
    from importlib.resources import files

    folder = files("geospec.specs")
    return {
        entry.name.removesuffix(".toml"): Path(str(entry))
        for entry in folder.iterdir()
        if entry.name.endswith(".toml")
    }


def find_spec_file(given: str | Path) -> Path:
    """The spec a command names: a file, or else a shipped example by name (``tiny`` or
    ``tiny.toml``), so that ``geospec run tiny`` works from any directory and any install.

    A file in the current directory wins over a shipped spec of the same name; a name that is
    neither comes back unchanged, for :func:`read_toml` to report."""
    path = Path(given)
    if path.exists() or len(path.parts) != 1:
        return path
    return shipped_specs().get(path.name.removesuffix(".toml"), path)


def read_toml(path: Path) -> dict[str, Any]:
    """Parse a TOML file into plain Python values, or raise :class:`SpecError` saying where."""
    source = str(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        shipped = ", ".join(sorted(shipped_specs()))
        raise SpecError(
            source, [f"no such file; check the path, or name a shipped spec ({shipped})"]
        ) from None
    except IsADirectoryError:
        raise SpecError(source, ["is a directory; give the path of a .toml spec file"]) from None
    except OSError as error:
        raise SpecError(source, [f"cannot be read: {error.strerror}"]) from None
    if len(raw) > MAX_SPEC_BYTES:
        raise SpecError(source, [f"is {len(raw)} bytes; a spec is a small TOML file"])
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw[: error.start].count(b"\n") + 1
        raise SpecError(
            source, [f"line {line}: not valid UTF-8 (byte {error.start}); save the file as UTF-8"]
        ) from None
    if "\x00" in text:
        raise SpecError(source, ["contains NUL bytes: this is not a TOML text file"])
    try:
        document = tomlkit.parse(text)
    except KeyAlreadyPresent as error:
        raise SpecError(*_duplicate_key(source, text, str(error))) from None
    except ParseError as error:
        message = str(error).split(" at line ")[0]
        if "already exists" in message:  # tomlkit >= 0.15 reports a duplicate key as a ParseError
            raise SpecError(*_duplicate_key(source, text, message)) from None
        raise SpecError(f"{source}:{error.line}:{error.col}", [message]) from None
    except Exception as error:  # tomlkit raises a few non-ParseError exceptions on odd input
        raise SpecError(source, [f"TOML syntax error: {error}"]) from None
    unwrapped: dict[str, Any] = document.unwrap()
    return unwrapped


def _duplicate_key(source: str, text: str, message: str) -> tuple[str, list[str]]:
    """Point at the second definition of a key that tomlkit reports as defined twice."""
    match = re.search(r'Key "(.+?)" already exists', message)
    if match is None:
        return source, [f"TOML syntax error: {message}"]
    key = match.group(1)
    pattern = re.compile(rf"^\s*(\[+\s*)?{re.escape(key)}\s*(=|\]+)")
    lines = [i for i, line in enumerate(text.splitlines(), start=1) if pattern.match(line)]
    problem = f"{key!r} is defined twice; remove one of the definitions"
    if len(lines) >= 2:
        return f"{source}:{lines[1]}:1", [f"{problem} (the first is on line {lines[0]})"]
    return source, [problem]


def load_spec(
    path: str | Path, overrides: Sequence[str] = (), *, check_memory: bool = True
) -> Spec:
    """Read, validate and cross-check a spec file, with ``overrides`` (``--set`` values,
    ``dotted.key=value``) applied to it first: validated exactly like the file; then checked
    against the files it names and, with ``check_memory`` (commands that load the checkpoint,
    and validate), whether this machine can hold the checkpoint."""
    path = Path(path)
    data = read_toml(path)
    apply_overrides(data, overrides)
    load_plugin_files(data, path)
    # What only the file's place can tell (local paths, the checkpoint's shape) is said together
    # with the spec's own problems, after them.
    missing = local_path_problems(data, path.parent)
    no_checkpoint = any(problem.startswith("reference.checkpoint:") for problem in missing)
    shape_problems, unread = (
        ([], True) if no_checkpoint else fill_model_from_checkpoint(data, path.parent)
    )
    problems = missing + shape_problems
    try:
        spec = validate_spec(data, source=str(path))
    except SpecError as error:
        told = error.problems
        if unread:  # why [model]'s keys are missing is said once, by the checkpoint's line
            told = [p for p in told if not (p.startswith("model.") and p.endswith(_MISSING))]
        raise SpecError(error.source, told + problems) from None
    if problems:
        raise SpecError(str(path), problems)
    from geospec.spec.file_checks import file_problems, loading_memory_problem

    problems = file_problems(spec, path.parent)
    if check_memory and (memory := loading_memory_problem(spec)) is not None:
        problems.append(memory)
    if problems:
        raise SpecError(str(path), problems)
    return spec


_MISSING = "required key is missing"


def _table(data: Any, *keys: str) -> dict[str, Any]:
    for key in keys:
        data = data.get(key) if isinstance(data, dict) else None
    return data if isinstance(data, dict) else {}


def local_path_problems(data: dict[str, Any], spec_dir: Path) -> list[str]:
    """The local model paths of a spec (``reference.checkpoint``, a pretrained
    ``data.tokenizer.path``) that do not exist: a placeholder is caught here, not hours later.
    A hub id (given with its revision) is checked by the spec's own validation."""
    problems = []
    for field, table in (
        ("reference.checkpoint", _table(data, "reference")),
        ("data.tokenizer.path", _table(data, "data", "tokenizer")),
    ):
        name = field.rsplit(".", 1)[1]
        given = table.get(name)
        if not isinstance(given, str) or table.get("revision") is not None:
            continue
        if field == "data.tokenizer.path" and table.get("kind") != "pretrained":
            continue
        local = spec_path(given, spec_dir)
        if not local.exists():
            problems.append(
                f"{field}: {local} does not exist; give a local Hugging Face model directory or "
                "a .gguf file (relative to the spec file), or a hub id with its revision"
            )
    return problems


def fill_model_from_checkpoint(data: dict[str, Any], spec_dir: Path) -> tuple[list[str], bool]:
    """Fill ``[model]`` from a pretrained ``reference.checkpoint``'s own config (what the spec
    leaves out). The problems: in a probe-only or pruning spec, each value the spec gives that
    contradicts the checkpoint; or why the shape could not be read when ``[model]`` needed it,
    which the flag (True) says, so that its missing keys are not listed again."""
    from geospec.spec.checkpoint_shape import (
        GGUFUnreadable,
        HubUnreadable,
        fill_model,
        read_checkpoint_shape,
    )

    reference = _table(data, "reference")
    checkpoint = reference.get("checkpoint")
    if not isinstance(checkpoint, str):
        return [], False
    revision = reference.get("revision")
    found = read_checkpoint_shape(
        checkpoint, revision if isinstance(revision, str) else None, spec_dir
    )
    model = data.setdefault("model", {})
    if isinstance(found, str) or not isinstance(model, dict):
        if isinstance(model, dict) and "n_layers" not in model:
            if isinstance(found, HubUnreadable):  # already a line naming reference.revision
                return [f"{found}; [model] is read from it"], True
            if isinstance(found, GGUFUnreadable):  # a damaged file: [model] would not help
                return [str(found)], True
            why = f"model: the checkpoint's shape cannot be read ({found})"
            return [f"{why}; give [model] in full (docs/pretrained.md)"], True
        return [], False
    problems: list[str] = []
    # Probing or pruning the checkpoint, [model] *is* the checkpoint: a different value is a
    # mistake. A spec that trains arms may give a target of its own (the profiles are resampled
    # to its depth), so there a given value stands and only what is left out is filled.
    strict = data.get("probe_only") is True or "prune" in data
    fill_model(
        model,
        found,
        lambda name, message: problems.append(f"model.{name}: {message}") if strict else None,
    )
    # a prune of a GGUF file rounds its widths to the blocks its export is stored in
    from geospec.spec.width_grid import fill_grid

    fill_grid(data, spec_dir)
    return problems, False


def load_plugin_files(data: dict[str, Any], path: Path) -> None:
    """Register the spec's ``plugins`` files (relative to the spec file) before the rest is
    validated: their plugins may be named anywhere in it. A malformed list is left to
    validation to name."""
    files = data.get("plugins")
    if not isinstance(files, list) or not all(isinstance(f, str) and f for f in files):
        return
    from geospec.registry.files import use_plugin_files

    use_plugin_files([path.parent / f for f in files], f"{path}: plugins")


#: One segment of an override's key: a name, then any list indices (``arms[1]``).
_SEGMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_-]*)((?:\[\d+\])*)$")


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> None:
    """Set each ``dotted.key=value`` of ``overrides`` in ``data`` (the spec's TOML as read).

    The value is a TOML value (``3e-4``, ``true``, ``[0, 1]``, ``{ kind = "uniform" }``,
    ``"text"``); one that does not parse as TOML is taken as a string (``name=study-2``). Keys are
    dotted paths as error messages print them, list entries by index (``arms[1].schedule``);
    missing tables are created, so a section the file lacks can be given. A malformed override is
    a :class:`SpecError` naming it."""
    problems = []
    for override in overrides:
        key, sep, text = override.partition("=")
        key = key.strip()
        if not sep or not key:
            problems.append(
                f"--set {override!r}: give dotted.key=value (for example train.lr=1e-3)"
            )
            continue
        try:
            _set(data, key, _toml_value(text.strip()))
        except ValueError as error:
            problems.append(f"--set {key}: {error}")
    if problems:
        raise SpecError("--set", problems)


def _toml_value(text: str) -> Any:
    try:
        value = tomlkit.parse(f"value = {text}")["value"]
    except Exception:  # not TOML: a bare word is meant as a string
        return text
    return value.unwrap() if hasattr(value, "unwrap") else value


def _set(data: dict[str, Any], key: str, value: Any) -> None:
    node: Any = data
    steps: list[str | int] = []
    for segment in key.split("."):
        match = _SEGMENT.match(segment)
        if match is None:
            raise ValueError(f"{segment!r} is not a key (letters, digits, _ and -, then [index])")
        steps.append(match.group(1))
        steps += [int(i) for i in re.findall(r"\[(\d+)\]", match.group(2))]
    for step, following in itertools.pairwise(steps):
        node = _child(node, step, following)
    last = steps[-1]
    if isinstance(last, int):
        if not isinstance(node, list) or last >= len(node):
            raise ValueError(f"index [{last}] is beyond the list (it has {_length(node)} entries)")
        node[last] = value
    elif isinstance(node, dict):
        node[last] = value
    else:
        raise ValueError(f"{last!r} is set inside a {type(node).__name__}, not a table")


def _child(node: Any, step: str | int, following: str | int) -> Any:
    if isinstance(step, int):
        if not isinstance(node, list) or step >= len(node):
            raise ValueError(f"index [{step}] is beyond the list (it has {_length(node)} entries)")
        return node[step]
    if not isinstance(node, dict):
        raise ValueError(f"{step!r} is looked up inside a {type(node).__name__}, not a table")
    if step not in node:
        node[step] = [] if isinstance(following, int) else {}
    return node[step]


def _length(node: Any) -> int:
    return len(node) if isinstance(node, list) else 0


def validate_spec(data: dict[str, Any], source: str = "<spec>") -> Spec:
    if not data:
        raise SpecError(
            source, ["is empty; a spec needs at least name, [model], [[arms]] and [train]"]
        )
    try:
        spec = Spec.model_validate(data)
    except ValidationError as error:
        raise SpecError(source, [format_error(e, data) for e in error.errors()]) from None
    problems = cross_check(spec)
    if problems:
        raise SpecError(source, [f"{path}: {message}" for path, message in problems])
    return spec


def format_error(error: Any, data: dict[str, Any]) -> str:
    """One pydantic error as ``dotted.path: message`` with a hint where one helps."""
    loc = tuple(error["loc"])
    path, parent = _walk(loc, data)
    kind = error["type"]
    message = error["msg"]
    if kind == "missing":
        message = _MISSING
    elif kind == "extra_forbidden":
        key = str(loc[-1]) if loc else "?"
        message = "unknown key"
        if parent is not None:
            allowed = [k for k in parent.model_fields if k != "kind"]
            close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
            message += f"; did you mean {close[0]!r}?" if close else ""
            message += f" (allowed: {', '.join(allowed)})"
    elif kind == "value_error":
        message = message.removeprefix("Value error, ")
    elif kind.startswith(("int_", "float_", "string_", "bool_")) and "input" in error:
        message += f" (got {_short(error['input'])})"
    return f"{path}: {message}" if path else message


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _walk(loc: tuple[Any, ...], data: Any) -> tuple[str, type[BaseModel] | None]:
    """Turn a pydantic location into the dotted path a user sees in the TOML file.

    Also returns the model class that holds the last key (for "did you mean"). Discriminator tags
    that pydantic inserts into locations of tagged unions (``tokenizer.bpe.vocab_size``) are
    dropped.
    """
    path = ""
    cls: type[BaseModel] | None = Spec
    value = data
    parent: type[BaseModel] | None = Spec
    for part in loc:
        parent = cls
        if isinstance(part, int):
            path += f"[{part}]"
            value = value[part] if isinstance(value, list) and part < len(value) else None
            continue
        if cls is None or part not in cls.model_fields:
            # a union tag, or a key the model does not have (extra): keep user-visible keys only
            if isinstance(value, dict) and part in value:
                path += f".{part}" if path else str(part)
                value = value[part]
            cls = None
            continue
        path += f".{part}" if path else str(part)
        value = value.get(part) if isinstance(value, dict) else None
        cls = _model_of_field(cls.model_fields[part], value)
    return path, parent


def _model_of_field(field: FieldInfo, value: Any) -> type[BaseModel] | None:
    """The pydantic model a value of this field is validated with, if it is one."""
    from geospec.registry.loading import get_registries

    kind = value.get("kind") if isinstance(value, dict) else None
    for meta in field.metadata:
        if isinstance(meta, PluginTable):
            registry = get_registries()[meta.kind]
            return (
                registry.get(kind).cls.Params
                if isinstance(kind, str) and kind in registry
                else None
            )
    candidates: list[type[BaseModel]] = []

    def collect(tp: Any) -> None:
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            candidates.append(tp)
        for arg in typing.get_args(tp):
            collect(arg)

    collect(field.annotation)
    if len(candidates) == 1:
        return candidates[0]
    for cls in candidates:  # a tagged union: pick the member whose kind matches
        kind_field = cls.model_fields.get("kind")
        if kind_field is not None and kind_field.default == kind:
            return cls
    return None
