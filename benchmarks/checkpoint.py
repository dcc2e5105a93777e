"""A random checkpoint folder as a user would bring one, and what serving it in fp8s needs beside it.

`write_checkpoint` writes `benchmarks.gemma12b.random_tensors` as a Gemma 4 "unified" checkpoint: ``config.json``
(``gemma4_unified`` with the text config inside), sharded safetensors under ``model.language_model.*`` with a
``model.safetensors.index.json``, and the tiny model's tokenizer (``tokenizer.json`` from spinf/catalog/tiny_gemma4,
8,192 ids, all valid in the 12B's vocabulary). Both our engine and the reference engine (spinf-serve 0.1.1) load
it as it is. A ``gemma4_text`` config (the 31B's, `benchmarks.gemma31b`) is written as a ``gemma4`` checkpoint
instead, as transformers' ``Gemma4ForConditionalGeneration`` saves one: the text config nested and, given a
``vision_config``, the vision tower's random weights under ``model.vision_tower.*`` and ``model.embed_vision.*``,
which our engine does not read (the reference engine loads unified checkpoints only); the E4B's
(`benchmarks.gemma_e4b`) too, with its per-layer input weights (``embed_tokens_per_layer``,
``per_layer_model_projection``, ``per_layer_projection_norm``, and each layer's ``per_layer_input_gate``,
``per_layer_projection`` and ``post_per_layer_input_norm``) where transformers saves them. The folder's name is its
revision, a hash of what was written, so a second call in the same run finds the folder done and writes nothing; a
folder is complete once its ``.complete`` file exists.

The benchmarks serve it the way the server serves a catalog model: `write_manifest` writes a manifest for
`MODEL_ID` (``bench/gemma31b-random`` for a ``gemma4`` folder, ``bench/gemma-e4b-random`` for the E4B's:
`Folder.model_id`; a catalog model, so its fp8s passes are shared across calls and its floors cached, as for the
models we ship) into a folder that
``SPINF_MANIFEST_DIRS`` names. On the CPU, where the engine runs catalog models only on a GPU, the folder is opened
by its path instead (`open_engine`). fp8s needs a scale table: `calibrate_folder` makes one with
`spinf.engine.calibrate` (what ``spinf-serve calibrate`` runs) on the checkpoint in float precision and ships it in
the folder; `reference_scales` renames its entries for the reference engine's unfused linears.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import math
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
from benchmarks.gemma31b import gemma4_config, random_vision_tensors, vision_weight_shapes
from spinf.engine.calibrate import calibrate
from spinf.engine.engine import Engine
from spinf.engine.gemma4.embedders import DEFAULT_TOKENS
from spinf.engine.scales import SHIPPED_TABLE, write_table
from spinf.settings import Limits

MODEL_ID = "bench/gemma12b-random"
# the catalog model a folder is served as, and its manifest's name, by the text model's type
SERVED = {
    "gemma4_unified_text": (MODEL_ID, "12B-shaped random checkpoint (benchmarks)"),
    "gemma4_unified_media": ("bench/gemma12b-media-random", "12B-shaped random checkpoint with media embedders"),
    "gemma4_text": ("bench/gemma31b-random", "31B-shaped random checkpoint (benchmarks)"),
    "gemma4_text_moe": ("bench/gemma26b-a4b-random", "26B A4B-shaped random checkpoint (benchmarks)"),
    "gemma4_text_per_layer": ("bench/gemma-e4b-random", "E4B-shaped random checkpoint (benchmarks)"),
}
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
# Written by benchmarks/checkpoint.py: one of the benchmarks' random checkpoints, served as a catalog model.
id = "{id}"
name = "{name}"
status = "available"
family = "gemma4"
media = {media}
{image}
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
    on_gpu: bool  # written for a GPU engine (bf16, served as `model_id`) or a CPU one (fp32, served by its path)
    model_id: str = MODEL_ID  # the catalog model it is served as on a GPU (`SERVED`)
    media: bool = False  # with the 12B's media embedders


@contextlib.contextmanager
def work_dir(path: Path | None) -> Iterator[Path]:
    """``path`` (made if need be, kept), or a temporary folder removed afterwards: where a run's folder goes."""
    if path is not None:
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="spinf-bench-") as temporary:
        yield Path(temporary)


# The 12B's media embedders (transformers' Gemma4UnifiedVisionConfig and AudioConfig defaults: the vision embedder
# 3,840 wide, a 1,120-row positional table; audio frames of 640 samples) and its media token ids.
VISION_12B = {
    "model_type": "gemma4_unified_vision",
    "patch_size": 16,
    "pooling_kernel_size": 3,
    "mm_embed_dim": 3840,
    "mm_posemb_size": 1120,
    "output_proj_dims": 3840,
    "rms_norm_eps": 1e-06,
}
AUDIO_12B = {"model_type": "gemma4_unified_audio", "audio_embed_dim": 640, "rms_norm_eps": 1e-06}
MEDIA_TOKENS_12B = DEFAULT_TOKENS  # the real ids, which a config.json may also leave out
MEDIA_IMAGE_TABLE = '[image]\nscheme = "gemma"\nside = 48\ndetail_tokens = { low = 70, auto = 280, high = 1120 }\n'


def media_tokens(text_config: dict[str, Any]) -> dict[str, int]:
    """The 12B's media token ids, or the tiny model's where the vocabulary is too small for them (`scaled`)."""
    from spinf.engine.gemma4.tiny import TINY_MEDIA_TOKENS

    fits = text_config["vocab_size"] > max(MEDIA_TOKENS_12B.values())
    return MEDIA_TOKENS_12B if fits else TINY_MEDIA_TOKENS


def unified_config(text_config: dict[str, Any], dtype: torch.dtype, media: bool = False) -> dict[str, Any]:
    """``config.json`` of a unified checkpoint: text only, or with the 12B's media embedders (``media``)."""
    name = str(dtype).removeprefix("torch.")
    return {
        "model_type": "gemma4_unified",
        "architectures": ["Gemma4UnifiedForConditionalGeneration"],
        "text_config": {**text_config, "dtype": name},
        "vision_config": VISION_12B if media else None,
        "audio_config": AUDIO_12B if media else None,
        **(media_tokens(text_config) if media else {}),
        "tie_word_embeddings": True,
        "dtype": name,
    }


def checkpoint_config(
    text_config: dict[str, Any], dtype: torch.dtype, vision_config: dict | None = None, media: bool = False
) -> dict:
    """``config.json`` for ``text_config``: a unified checkpoint (the 12B, with its media embedders when ``media``)
    or a ``gemma4`` one (the 31B)."""
    if text_config["model_type"] == "gemma4_text":
        return gemma4_config(text_config, vision_config, dtype)
    if vision_config is not None:
        raise ValueError("a vision tower is written for a gemma4_text config only")
    return unified_config(text_config, dtype, media)


def weight_shapes(
    text_config: dict[str, Any], vision_config: dict | None = None, media: bool = False
) -> dict[str, tuple[int, ...]]:
    """Every tensor the folder holds, by its name in the files, in the order they are drawn and written."""
    from spinf.engine.gemma4.tiny import media_weight_shapes, tiny_weight_shapes

    shapes = {PREFIX + k.removeprefix("model."): s for k, s in sorted(tiny_weight_shapes(text_config).items())}
    if vision_config is not None:
        shapes.update(sorted(vision_weight_shapes(vision_config, text_config["hidden_size"]).items()))
    if media:
        shapes.update(sorted(media_weight_shapes(text_config["hidden_size"], VISION_12B, AUDIO_12B).items()))
    return shapes


def _shard_plan(
    text_config: dict[str, Any], dtype: torch.dtype, shard_bytes: int, vision_config: dict | None = None, media=False
) -> list[list[str]]:
    """The checkpoint's names (in `weight_shapes` order) split into shards of about ``shard_bytes``."""
    size = torch.empty((), dtype=dtype).element_size()
    shards, current, total = [], [], 0
    for key, shape in weight_shapes(text_config, vision_config, media).items():
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
    vision_config: dict | None = None,
    media: bool = False,
) -> Folder:
    """The checkpoint folder of ``text_config`` (and ``vision_config``'s tower, or with ``media`` the 12B's media
    embedders) under ``root``: bf16 for a GPU, fp32 for the CPU, drawn on ``device`` tensor by tensor; written unless
    a complete one is there already (a file system without room for it is refused before anything is written)."""
    on_gpu = device.type == "cuda"
    dtype = torch.bfloat16 if on_gpu else torch.float32
    config = checkpoint_config(text_config, dtype, vision_config, media)
    stamp = json.dumps([FOLDER_FORMAT, config, seed, shard_bytes], sort_keys=True).encode()
    revision = hashlib.sha1(stamp, usedforsecurity=False).hexdigest()
    folder = Path(root) / revision
    write_s = 0.0
    if not (folder / COMPLETE).exists():
        Path(root).mkdir(parents=True, exist_ok=True)
        check_room(Path(root), text_config, dtype, vision_config)
        started = time.perf_counter()
        draw = {"device": device, "seed": seed, "shard_bytes": shard_bytes, "vision_config": vision_config}
        _write(folder, config, text_config, dtype, media=media, **draw)
        write_s = time.perf_counter() - started
    num_bytes = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    return Folder(folder, revision, num_bytes, write_s, on_gpu, SERVED[served_key(text_config, media)][0], media)


def served_key(text_config: dict[str, Any], media: bool = False) -> str:
    """Which of `SERVED` a folder is: the text model's type, or the 12B with media, or a ``gemma4_text`` model with
    per-layer inputs (the E4B, `benchmarks.gemma_e4b`)."""
    if media:
        return "gemma4_unified_media"
    if text_config.get("hidden_size_per_layer_input"):
        return "gemma4_text_per_layer"
    if text_config.get("enable_moe_block"):  # the 26B A4B's (`benchmarks.gemma26b`)
        return "gemma4_text_moe"
    return text_config["model_type"]


def check_room(root: Path, text_config: dict, dtype: torch.dtype, vision_config: dict | None = None) -> None:
    """Refuses a folder the file system under ``root`` has no room for (the 31B's is 58 GiB in bf16)."""
    size = torch.empty((), dtype=dtype).element_size()
    needed = size * sum(math.prod(shape) for shape in weight_shapes(text_config, vision_config).values())
    free = shutil.disk_usage(root).free
    if needed > free:
        raise OSError(
            f"the checkpoint needs {needed / 2**30:.1f} GiB and {root} has {free / 2**30:.1f} GiB free: give a "
            "--work folder on a larger file system (a tmpfs such as /dev/shm if memory allows)"
        )


def _tensors(text_config: dict, dtype: torch.dtype, vision_config: dict | None, media: bool = False, **draw: Any):
    """`random_tensors` under the files' names, then the vision tower's or the media embedders' (`weight_shapes`
    order)."""
    for key, tensor in random_tensors(text_config, dtype=dtype, **draw):
        yield PREFIX + key.removeprefix("model."), tensor
    if vision_config is not None:
        yield from random_vision_tensors(vision_config, text_config["hidden_size"], dtype=dtype, **draw)
    if media:
        from spinf.engine.gemma4.tiny import draw_media, media_weight_shapes

        generator = torch.Generator(device=torch.device(draw["device"])).manual_seed(draw["seed"] + 1)
        for key, shape in sorted(media_weight_shapes(text_config["hidden_size"], VISION_12B, AUDIO_12B).items()):
            yield key, draw_media(key, shape, generator).to(dtype)


def drawn_shards(
    text_config: dict, dtype: torch.dtype, vision_config: dict | None, shard_bytes: int, media=False, **draw: Any
) -> Iterator[tuple[str, dict[str, torch.Tensor]]]:
    """The checkpoint's shards as (file name, tensors by name), drawn one tensor at a time on ``draw["device"]``
    (`_tensors` order), as `_shard_plan` splits them."""
    plan = _shard_plan(text_config, dtype, shard_bytes, vision_config, media)
    names = [f"model-{i + 1:05d}-of-{len(plan):05d}.safetensors" for i in range(len(plan))]
    tensors = _tensors(text_config, dtype, vision_config, media, **draw)
    for name, keys in zip(names, plan, strict=True):
        shard = {}
        for key in keys:
            drawn, tensor = next(tensors)
            if drawn != key:
                raise RuntimeError(f"drew {drawn} where the shard plan has {key}")
            shard[key] = tensor
        yield name, shard


def write_tokenizer(folder: Path) -> None:
    """The tiny model's tokenizer files (8,192 ids, all valid in the real vocabularies) into ``folder``."""
    tokenizer = resources.files("spinf.catalog") / "tiny_gemma4" / "tokenizer.json"
    (folder / "tokenizer.json").write_bytes(tokenizer.read_bytes())
    (folder / "tokenizer_config.json").write_text(json.dumps(TOKENIZER_CONFIG, indent=2) + "\n")
    special = {k: v for k, v in TOKENIZER_CONFIG.items() if k.endswith("_token")}
    (folder / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")


def _write(folder: Path, config: dict, text_config: dict, dtype: torch.dtype, **draw: Any) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    vision_config, shard_bytes = draw.pop("vision_config"), draw.pop("shard_bytes")
    weight_map = {}
    for name, shard in drawn_shards(text_config, dtype, vision_config, shard_bytes, **draw):
        shard = {key: tensor.cpu() for key, tensor in shard.items()}
        save_file(shard, folder / name, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, name))
        del shard
    index = {"metadata": {"total_size": sum(p.stat().st_size for p in folder.glob("*.safetensors"))}}
    (folder / "model.safetensors.index.json").write_text(json.dumps({**index, "weight_map": weight_map}, indent=1))
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    write_tokenizer(folder)
    (folder / COMPLETE).write_text("")


def write_manifest(root: Path, folder: Folder) -> Path:
    """The manifest of `MODEL_ID` at ``folder``'s revision, in a folder of its own for ``SPINF_MANIFEST_DIRS``."""
    manifests = Path(root) / "manifests"
    manifests.mkdir(parents=True, exist_ok=True)
    name = next(title for model_id, title in SERVED.values() if model_id == folder.model_id)
    media, image = ('["image", "audio", "video"]', MEDIA_IMAGE_TABLE) if folder.media else ("[]", "")
    text = MANIFEST.format(id=folder.model_id, name=name, revision=folder.revision, media=media, image=image)
    (manifests / "bench.toml").write_text(text)
    return manifests


def open_engine(folder: Folder, root: Path, *, quant: str, limits: Limits, token_budget: int | None = None) -> Engine:
    """The engine on ``folder`` as ``spinf-serve serve`` would open it: on a GPU the catalog model
    ``folder.model_id`` (``--model-dir``), on the CPU the folder by its path (fp32: the CPU runs no catalog model
    and no fp8)."""
    if not folder.on_gpu:
        return Engine(str(folder.path), device="cpu", quant="fp32", limits=limits, token_budget=token_budget)
    os.environ["SPINF_MANIFEST_DIRS"] = str(write_manifest(root, folder))
    return Engine(
        folder.model_id,
        device="cuda",
        quant=quant,
        model_dir=str(folder.path),
        limits=limits,
        token_budget=token_budget,
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
    """The folder's text weights under transformers' text-model names (``model.layers.0…``), memory-mapped; the
    vision tower's are left out."""
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    state = {}
    for shard in sorted(set(index["weight_map"].values())):
        with safe_open(str(folder / shard), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 - safe_open is no dict
                if key.startswith(PREFIX):
                    state["model." + key.removeprefix(PREFIX)] = f.get_tensor(key)
    return state


def main(argv: list[str] | None = None) -> None:
    """``python -m benchmarks.checkpoint --work DIR [--shape 31b] [--device cuda]``: write a folder, say where."""
    import argparse

    from benchmarks.shapes import SHAPES, model_config, model_vision

    p = argparse.ArgumentParser(description="Write a benchmarks' random checkpoint folder (found: nothing written).")
    p.add_argument("--work", type=Path, required=True, help="the folder goes under this one, named by its revision")
    p.add_argument("--shape", choices=SHAPES, default="12b")
    p.add_argument("--scaled", action="store_true")
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--device", default="cuda")
    args = p.parse_args(argv)
    folder = write_checkpoint(
        args.work, model_config(args), device=torch.device(args.device), vision_config=model_vision(args)
    )
    done = f"written in {folder.write_s:.1f} s" if folder.write_s else "found"
    print(f"{folder.path}: {folder.num_bytes / 2**30:.2f} GiB {done}; served as {folder.model_id}", flush=True)


if __name__ == "__main__":
    main()
