"""A random checkpoint folder as a user would bring one, and what serving it in fp8s needs beside it.

`write_checkpoint` writes `benchmarks.gemma12b.random_tensors` as a Gemma 4 "unified" checkpoint: ``config.json``
(``gemma4_unified`` with the text config inside), sharded safetensors under ``model.language_model.*`` with a
``model.safetensors.index.json``, and the tiny model's tokenizer (``tokenizer.json`` from spinf/catalog/tiny_gemma4,
8,192 ids, all valid in the 12B's vocabulary). Both our engine and the reference engine (spinf-serve 0.1.1) load
it as it is. The folder's name is its revision, a hash of what was written, so a second call in the same run finds
the folder done and writes nothing; a folder is complete once its ``.complete`` file exists.

The benchmarks serve it the way the server serves a catalog model: `write_manifest` writes a manifest for
`MODEL_ID` (a catalog model, so its fp8s passes are shared across calls and its floors cached, as for the models
we ship) into a folder that ``SPINF_MANIFEST_DIRS`` names. On the CPU, where the engine runs catalog models only
on a GPU, the folder is opened by its path instead (`open_engine`). fp8s needs a scale table: `calibrate_folder`
makes one with `spinf.engine.calibrate` (what ``spinf-serve calibrate`` runs) on the checkpoint in float precision
and ships it in the folder; `reference_scales` renames its entries for the reference engine's unfused linears.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import attrs
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from benchmarks.gemma12b import random_tensors
from spinf.engine.calibrate import calibrate
from spinf.engine.engine import Engine
from spinf.engine.scales import SHIPPED_TABLE, write_table
from spinf.settings import Limits

MODEL_ID = "bench/gemma12b-random"
FOLDER_FORMAT = "benchmarks.checkpoint 1"  # part of the revision: bump when the files written change
PREFIX = "model.language_model."
SHARD_BYTES = 4 * 2**30
COMPLETE = ".complete"
TOKENIZER_CONFIG = {
    "tokenizer_class": "PreTrainedTokenizerFast",
    "bos_token": "<bos>",
    "eos_token": "<eos>",
    "pad_token": "<pad>",
    "unk_token": "<unk>",
    "clean_up_tokenization_spaces": False,
    "model_max_length": 131072,
}
MANIFEST = """\
# Written by benchmarks/checkpoint.py: the benchmarks' random 12B-shaped checkpoint, served as a catalog model.
id = "{id}"
name = "12B-shaped random checkpoint (benchmarks)"
status = "available"
family = "gemma4"
media = []

[source]
repo = "{id}"
revision = "{revision}"
format = "safetensors-bf16"

[quant]
allowed = ["fp8s", "bf16"]
"""


@attrs.frozen
class Folder:
    """A written checkpoint: where, its revision, its safetensors bytes, and how long writing took (0: found)."""

    path: Path
    revision: str
    num_bytes: int
    write_s: float
    on_gpu: bool  # written for a GPU engine (bf16, served as `MODEL_ID`) or a CPU one (fp32, served by its path)


@contextlib.contextmanager
def work_dir(path: Path | None) -> Iterator[Path]:
    """``path`` (made if need be, kept), or a temporary folder removed afterwards: where a run's folder goes."""
    if path is not None:
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="spinf-bench-") as temporary:
        yield Path(temporary)


def unified_config(text_config: dict[str, Any], dtype: torch.dtype) -> dict[str, Any]:
    """``config.json`` of a text-only unified checkpoint (no vision or audio towers)."""
    name = str(dtype).removeprefix("torch.")
    return {
        "model_type": "gemma4_unified",
        "architectures": ["Gemma4UnifiedForConditionalGeneration"],
        "text_config": {**text_config, "dtype": name},
        "vision_config": None,
        "audio_config": None,
        "tie_word_embeddings": True,
        "dtype": name,
    }


def _shard_plan(text_config: dict[str, Any], dtype: torch.dtype, shard_bytes: int) -> list[list[str]]:
    """The checkpoint's keys (in `random_tensors` order) split into shards of about ``shard_bytes``."""
    from spinf.engine.tiny import tiny_weight_shapes

    size = torch.empty((), dtype=dtype).element_size()
    shards, current, total = [], [], 0
    for key, shape in sorted(tiny_weight_shapes(text_config).items()):
        nbytes = size * int(torch.Size(shape).numel())
        if current and total + nbytes > shard_bytes:
            shards.append(current)
            current, total = [], 0
        current.append(key)
        total += nbytes
    return [*shards, current] if current else shards


def write_checkpoint(
    root: Path,
    text_config: dict[str, Any],
    *,
    device: torch.device,
    seed: int = 0,
    shard_bytes: int = SHARD_BYTES,
) -> Folder:
    """The checkpoint folder of ``text_config`` under ``root``: bf16 for a GPU, fp32 for the CPU, drawn on
    ``device`` tensor by tensor; written unless a complete one is there already."""
    on_gpu = device.type == "cuda"
    dtype = torch.bfloat16 if on_gpu else torch.float32
    config = unified_config(text_config, dtype)
    stamp = json.dumps([FOLDER_FORMAT, config, seed, shard_bytes], sort_keys=True).encode()
    revision = hashlib.sha1(stamp, usedforsecurity=False).hexdigest()
    folder = Path(root) / revision
    write_s = 0.0
    if not (folder / COMPLETE).exists():
        started = time.perf_counter()
        _write(folder, config, text_config, dtype, device=device, seed=seed, shard_bytes=shard_bytes)
        write_s = time.perf_counter() - started
    num_bytes = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    return Folder(folder, revision, num_bytes, write_s, on_gpu)


def _write(folder: Path, config: dict, text_config: dict, dtype: torch.dtype, **draw: Any) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    plan = _shard_plan(text_config, dtype, draw.pop("shard_bytes"))
    names = [f"model-{i + 1:05d}-of-{len(plan):05d}.safetensors" for i in range(len(plan))]
    weight_map, tensors = {}, random_tensors(text_config, dtype=dtype, **draw)
    for name, keys in zip(names, plan, strict=True):
        shard = {}
        for key in keys:
            drawn, tensor = next(tensors)
            if drawn != key:
                raise RuntimeError(f"drew {drawn} where the shard plan has {key}")
            shard[PREFIX + key.removeprefix("model.")] = tensor.cpu()
        save_file(shard, folder / name, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, name))
        del shard
    index = {"metadata": {"total_size": sum(p.stat().st_size for p in folder.glob("*.safetensors"))}}
    (folder / "model.safetensors.index.json").write_text(json.dumps({**index, "weight_map": weight_map}, indent=1))
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tokenizer = resources.files("spinf.catalog") / "tiny_gemma4" / "tokenizer.json"
    (folder / "tokenizer.json").write_bytes(tokenizer.read_bytes())
    (folder / "tokenizer_config.json").write_text(json.dumps(TOKENIZER_CONFIG, indent=2) + "\n")
    special = {k: v for k, v in TOKENIZER_CONFIG.items() if k.endswith("_token")}
    (folder / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")
    (folder / COMPLETE).write_text("")


def write_manifest(root: Path, folder: Folder) -> Path:
    """The manifest of `MODEL_ID` at ``folder``'s revision, in a folder of its own for ``SPINF_MANIFEST_DIRS``."""
    manifests = Path(root) / "manifests"
    manifests.mkdir(parents=True, exist_ok=True)
    (manifests / "bench.toml").write_text(MANIFEST.format(id=MODEL_ID, revision=folder.revision))
    return manifests


def open_engine(folder: Folder, root: Path, *, quant: str, limits: Limits, token_budget: int | None = None) -> Engine:
    """The engine on ``folder`` as ``spinf-serve serve`` would open it: on a GPU the catalog model `MODEL_ID`
    (``--model-dir``), on the CPU the folder by its path (fp32: the CPU runs no catalog model and no fp8)."""
    if not folder.on_gpu:
        return Engine(str(folder.path), device="cpu", quant="fp32", limits=limits, token_budget=token_budget)
    os.environ["SPINF_MANIFEST_DIRS"] = str(write_manifest(root, folder))
    return Engine(
        MODEL_ID, device="cuda", quant=quant, model_dir=str(folder.path), limits=limits, token_budget=token_budget
    )


def calibrate_folder(folder: Folder, root: Path, corpus: list[dict], limits: Limits) -> tuple[dict, float]:
    """A scale table for ``folder`` from ``corpus`` (`spinf.engine.calibrate` on the checkpoint in float precision),
    shipped in the folder as ``spinf_scales.json``; the table and the seconds it took, the load included."""
    started = time.perf_counter()
    engine = open_engine(folder, root, quant="bf16", limits=limits)
    table = calibrate(engine, corpus, corpus_name="the first 4 inputs of J1, J2 and J3")
    write_table(table, folder.path / SHIPPED_TABLE)
    del engine
    free_memory()
    return table, time.perf_counter() - started


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def reference_scales(scales: dict[str, float]) -> dict[str, float]:
    """Our scales (fused ``wqkv``, ``w_gate_up``) under the reference engine's linears: q, k and v read the input
    ``wqkv`` reads, gate and up the input of ``w_gate_up``, so each takes that scale."""
    names = {
        "wqkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
        "wo": ("self_attn.o_proj",),
        "w_gate_up": ("mlp.gate_proj", "mlp.up_proj"),
        "w_down": ("mlp.down_proj",),
    }
    out = {}
    for name, scale in scales.items():
        layer, _, linear = name.rpartition(".")
        for theirs in names[linear]:
            out[f"{layer}.{theirs}"] = scale
    return out


def text_state(folder: Path) -> dict[str, torch.Tensor]:
    """The folder's text weights under transformers' text-model names (``model.layers.0…``), memory-mapped."""
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    state = {}
    for shard in sorted(set(index["weight_map"].values())):
        with safe_open(str(folder / shard), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 - safe_open is no dict
                state["model." + key.removeprefix(PREFIX)] = f.get_tensor(key)
    return state
