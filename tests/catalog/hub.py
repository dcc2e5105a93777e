"""Fakes for the catalog tests: checkpoints on disk (Hub-cache snapshots and ``hf download --local-dir`` folders),
damaged shards, and a Hub on loopback that answers huggingface_hub's model lookup.

Shards are real safetensors files (written by the ``safetensors`` library, without torch) so the completeness
checks read the same bytes they read in production; a few float32 values each keep them tiny.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from tests.loopback import JsonHandler, LoopbackServer

GEMMA_CONFIG = {"model_type": "gemma4_unified", "architectures": ["Gemma4UnifiedForConditionalGeneration"]}
QWEN_CONFIG = {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"]}
LLAMA_CONFIG = {"model_type": "llama", "architectures": ["LlamaForCausalLM"]}


def write_checkpoint(folder: Path, *, config: dict | None = None, shards: int = 2, index: bool = True) -> Path:
    """A complete checkpoint in ``folder``: config.json, ``shards`` safetensors files and (optionally) their index."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(GEMMA_CONFIG if config is None else config))
    weight_map = {}
    for number in range(1, shards + 1):
        name = f"model-{number:05d}-of-{shards:05d}.safetensors" if index else "model.safetensors"
        save_file({f"layer{number}.weight": np.full((4, 4), number, dtype=np.float32)}, str(folder / name))
        weight_map[f"layer{number}.weight"] = name
    if index:
        (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


def write_snapshot(root: Path, repo: str, revision: str, **kwargs) -> Path:
    """A complete snapshot in the Hub cache layout under ``root``, with ``refs/main`` pointing at it."""
    repo_dir = root / ("models--" + repo.replace("/", "--"))
    folder = write_checkpoint(repo_dir / "snapshots" / revision, **kwargs)
    (repo_dir / "refs").mkdir(exist_ok=True)
    (repo_dir / "refs" / "main").write_text(revision)
    return folder


def write_local_dir(folder: Path, commit: str, **kwargs) -> Path:
    """A checkpoint as ``hf download --local-dir`` leaves it: files plus one metadata file per file."""
    write_checkpoint(folder, **kwargs)
    metadata = folder / ".cache" / "huggingface" / "download"
    metadata.mkdir(parents=True, exist_ok=True)
    for path in folder.iterdir():
        if path.is_file():
            (metadata / f"{path.name}.metadata").write_text(f'{commit}\n"etag"\n1700000000.0\n')
    return folder


def truncate(path: Path, num_bytes: int = 1) -> None:
    """Cuts the last ``num_bytes`` off a file, as an interrupted download leaves it."""
    data = path.read_bytes()
    path.write_bytes(data[:-num_bytes])


def rewrite_header(path: Path, tensor: str, **changes) -> None:
    """Changes the header entry of ``tensor`` in a safetensors file, keeping the header's length (padded with spaces,
    as the format allows) so that the data stays where it was: a file that is whole but whose header lies."""
    data = path.read_bytes()
    length = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + length])
    header[tensor].update(changes)
    text = json.dumps(header, separators=(",", ":")).encode()
    if len(text) > length:
        raise ValueError(f"the changed header needs {len(text)} bytes, the file has {length}")
    path.write_bytes(data[:8] + text.ljust(length) + data[8 + length :])


class _HubHandler(JsonHandler):
    def do_GET(self) -> None:
        hub: FakeHub = self.server.fake
        if self.path.startswith("/api/models/"):
            hub.seen.append(self.path)
        repo, _, revision = self.path.removeprefix("/api/models/").partition("/revision/")
        if not self.path.startswith("/api/models/") or repo not in hub.repos:
            self.answer(404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})
        elif revision and revision != hub.repos[repo]:
            self.answer(404, {"error": "Invalid rev id"}, {"X-Error-Code": "RevisionNotFound"})
        else:
            self.answer(200, {"id": repo, "sha": hub.repos[repo], "siblings": []}, {})


class FakeHub(LoopbackServer):
    """The Hub's model lookup on 127.0.0.1 (``GET /api/models/<repo>[/revision/<rev>]``, as ``HfApi.model_info``
    asks it) for ``repos``, ``{repo: its revision}``; any other repo or revision is the Hub's 404. ``seen`` records
    the lookups' paths. Nothing else of the Hub is there: anything else (a download; huggingface_hub's own fetch of
    its agent registry, unless telemetry is off) is a 404, and not recorded."""

    def __init__(self, repos: dict[str, str]):
        super().__init__(_HubHandler)
        self.repos = dict(repos)
        self.seen: list[str] = []
