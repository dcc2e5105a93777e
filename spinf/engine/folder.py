"""A checkpoint folder's files as both stacks read them: its safetensors shards (`read_tensors`, memory-mapped),
a vision tower's weights checked against the shapes it is built from (`check_tower_weights`), and its config's
values checked with the file named (`config_in_file`, `check_sizes`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import torch
from safetensors import SafetensorError, safe_open

from spinf.errors import ModelError

T = TypeVar("T")


def _open_shards(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.exists():
        try:
            names = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ModelError(f"{index}: not a readable shard index ({type(exc).__name__}: {exc})") from exc
        return [folder / n for n in names]
    single = folder / "model.safetensors"
    if not single.exists():
        raise ModelError(f"{folder} holds no model.safetensors (nor a sharded index)")
    return [single]


def read_tensors(folder: Path, prefix: str) -> dict[str, torch.Tensor]:
    """The tensors under ``prefix``, memory-mapped; a shard safetensors refuses is a `ModelError` naming it (the
    catalog's completeness check catches most before this, but not a file changed since or a folder given here)."""
    tensors = {}
    for shard in _open_shards(folder):
        try:
            with safe_open(str(shard), framework="pt") as f:
                for key in f.keys():
                    if key.startswith(prefix):
                        tensors[key[len(prefix) :]] = f.get_tensor(key)
        except (SafetensorError, OSError) as exc:
            raise ModelError(f"{shard}: not a readable safetensors file ({exc})") from exc
    return tensors


def config_in_file(path: Path, parse: Callable[[dict], T], raw: dict) -> T:
    """``parse(raw)``, with any problem of the file's content a `ModelError` that names ``path``: a missing key or
    a value of the wrong type otherwise surfaced as a bare ``KeyError 'hidden_size'`` or a torch error while the
    model was built, with no word of which file was wrong."""
    try:
        return parse(raw)
    except ModelError as exc:
        raise ModelError(f"{path}: {exc}") from exc
    except KeyError as exc:
        raise ModelError(f"{path}: the key {exc.args[0]!r} is missing") from exc
    except (TypeError, ValueError, AttributeError) as exc:
        raise ModelError(f"{path}: a value has the wrong type or form ({type(exc).__name__}: {exc})") from exc


def check_sizes(config: object, names: Sequence[str]) -> None:
    """`ModelError` for the first of ``names`` whose value is not a positive integer."""
    for name in names:
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ModelError(f"{name} must be a positive integer, not {value!r}")


def check_tower_weights(folder: Path, raw: dict[str, torch.Tensor], shapes: dict[str, tuple[int, ...]]) -> None:
    """A vision tower's weights ``raw`` (full names) against the ``shapes`` it is built from: a weight missing, of
    another shape, or one this build does not read is a `ModelError` naming it."""
    for name, shape in shapes.items():
        if name not in raw:
            raise ModelError(f"{folder}: the checkpoint lacks the vision tower weight {name!r}")
        if tuple(raw[name].shape) != shape:
            raise ModelError(f"{folder}: the vision tower weight {name!r} is {tuple(raw[name].shape)}, not {shape}")
    unread = sorted(set(raw) - set(shapes))
    if unread:
        raise ModelError(f"{folder}: the checkpoint has a vision tower weight this build does not read, {unread[0]!r}")
