"""Fake checkpoints on disk for the catalog tests: Hub-cache snapshots and ``hf download --local-dir`` folders.

Shards are real safetensors files (written by the ``safetensors`` library, without torch) so the completeness
checks read the same bytes they read in production; a few float32 values each keep them tiny.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

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
