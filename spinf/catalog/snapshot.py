"""A snapshot folder on disk: whether it is a complete checkpoint, and the revision ``hf download`` recorded in it.

Complete means every shard present, not truncated, and with a header that safetensors accepts (`snapshot_problem`);
the lookup (`spinf.catalog.checkpoint`) skips, and names, every folder that is not. Nothing here imports torch.
"""

from __future__ import annotations

import json
from pathlib import Path

INDEX_FILE = "model.safetensors.index.json"
_METADATA_DIR = Path(".cache") / "huggingface" / "download"


def local_dir_revision(folder: Path) -> str | None:
    """The commit recorded by ``hf download --local-dir`` in ``folder``, when all its metadata files agree."""
    metadata_dir = folder / _METADATA_DIR
    if not metadata_dir.is_dir():
        return None
    commits = set()
    for path in metadata_dir.rglob("*.metadata"):
        try:
            with path.open(encoding="utf-8") as file:
                commits.add(file.readline().strip())
        except (OSError, UnicodeDecodeError):
            return None
    return commits.pop() if len(commits) == 1 else None


def snapshot_problem(folder: Path) -> str | None:
    """Why ``folder`` is no complete checkpoint, or None.

    Complete means: a ``config.json``; with an index, every shard it lists present, not truncated and with a header
    safetensors accepts; without one, at least one ``*.safetensors`` file and all of them so.
    """
    if not (folder / "config.json").is_file():
        return "no config.json"
    index = folder / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            shards = sorted(set(weight_map.values()))
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as error:
            return f"{INDEX_FILE} cannot be read ({error})"
    else:
        shards = sorted(path.name for path in folder.glob("*.safetensors"))
        if not shards:
            return "no *.safetensors file"
    for shard in shards:
        problem = safetensors_problem(folder / shard)
        if problem is not None:
            return f"{shard}: {problem}"
    return None


def safetensors_problem(path: Path) -> str | None:
    """Why the safetensors file at ``path`` is missing or truncated, or None.

    The file starts with an 8-byte little-endian header length and the JSON header, whose tensors'
    ``data_offsets`` count from the end of the header; the file must reach the largest end.
    """
    try:
        size = path.stat().st_size
        with path.open("rb") as file:
            head = file.read(8)
            header_len = int.from_bytes(head, "little") if len(head) == 8 else -1
            if header_len < 0 or 8 + header_len > size:
                return f"truncated (header of {header_len} bytes in a {size}-byte file)"
            header = json.loads(file.read(header_len))
    except FileNotFoundError:
        return "missing"
    except (OSError, UnicodeDecodeError, ValueError) as error:
        return f"unreadable ({error})"
    if not isinstance(header, dict):
        return "the header is not a JSON object"
    ends = [
        entry["data_offsets"][1]
        for key, entry in header.items()
        if key != "__metadata__" and isinstance(entry, dict) and len(entry.get("data_offsets", ())) == 2
    ]
    needed = 8 + header_len + max(ends, default=0)
    if size < needed:
        return f"truncated ({size} bytes, the header says {needed})"
    return _header_problem(path)


def _header_problem(path: Path) -> str | None:
    """What safetensors itself refuses in a header (an unknown dtype, a shape that does not fit its bytes, offsets
    that do not tile the data), or None: the loader would stop there with an error naming no file."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="numpy"):
            return None
    except (SafetensorError, OSError) as error:
        return f"not a valid safetensors file ({error})"
