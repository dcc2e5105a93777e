"""Write the fp8-static (compressed-tensors float-quantized) form of a bf16 Gemma 4 checkpoint with compressed-tensors.

The published catalog checkpoints (``spinf/gemma-4-12b-fp8``, ``spinf/gemma-4-31b-fp8``) are in this format (engine
spec B.8): each decoder linear has an e4m3 ``weight [out, in]``, a ``weight_scale`` and an ``input_scale`` (fp32,
tensor strategy, ``dynamic: false``); the rest stays as it was. This tool makes such a folder from a bf16 (or fp32)
one with the compressed-tensors library itself, so that the engine's reader (`spinf.engine.gemma4.fp8_static`) is
checked against the format as the ecosystem writes it, not only against our own idea of it. It works shard by shard (a
31B checkpoint never sits in memory whole): per shard, the decoder linears become ``nn.Linear`` modules of a skeleton
named as in the checkpoint, compressed-tensors applies the scheme and compresses them, and the shard is written
back with the other tensors unchanged; the index and ``config.json`` (with compressed-tensors' own
``quantization_config``) follow.

Weight scales follow compressed-tensors' min-max rule for a symmetric fp8 tensor, ``amax / 448``; input scales come
from an fp8s scale table (ours, keyed by the engine's fused linears: ``layers.N.wqkv`` gives q, k and v their
scale) or one value for every linear.

    python contrib/fp8_static_checkpoint.py SRC DST [--table spinf_scales.json | --input-scale 0.5] [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from spinf.engine.quant import E4M3_MAX, divided

INDEX = "model.safetensors.index.json"
# checkpoint name of a decoder linear -> (layer, projection); the engine's fused name for each projection
LINEAR = re.compile(r"^(?P<prefix>.*)layers\.(?P<layer>\d+)\.(self_attn|mlp)\.(?P<proj>[a-z]+)_proj\.weight$")
FUSED = {"q": "wqkv", "k": "wqkv", "v": "wqkv", "o": "wo", "gate": "w_gate_up", "up": "w_gate_up", "down": "w_down"}
TEXT_PREFIXES = ("model.language_model.", "model.")
# the media embedders' projections (engine spec A.14.1: media embeddings stay bf16): kept as they are, and named in
# the config's ignore list as compressed-tensors names the linears it leaves alone
MEDIA_LINEAR = re.compile(r"^(?P<module>model\.embed_(vision|audio)\..+)\.weight$")


def _scheme_config(ignore: list[str]):
    from compressed_tensors.quantization import QuantizationArgs, QuantizationConfig, QuantizationScheme

    def args() -> QuantizationArgs:
        return QuantizationArgs(num_bits=8, type="float", strategy="tensor", symmetric=True, dynamic=False)

    scheme = QuantizationScheme(targets=["Linear"], weights=args(), input_activations=args())
    return QuantizationConfig(config_groups={"group_0": scheme}, ignore=ignore, quantization_status="frozen")


def _text_linear(name: str) -> re.Match | None:
    """The match of a text decoder linear's weight name (not the vision tower's, nor an embedder's)."""
    match = LINEAR.match(name)
    if match is None or match["prefix"] not in TEXT_PREFIXES or match["proj"] not in FUSED:
        return None
    return match


def _skeleton(weights: Mapping[str, torch.Tensor]) -> nn.Module:
    """A module tree whose ``nn.Linear`` leaves carry ``weights`` under their checkpoint names (``….weight``)."""
    root = nn.Module()
    for name, weight in weights.items():
        *path, leaf = name.removesuffix(".weight").split(".")
        node = root
        for part in path:
            if not hasattr(node, part):
                node.add_module(part, nn.Module())
            node = getattr(node, part)
        linear = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
        linear.weight = nn.Parameter(weight, requires_grad=False)
        node.add_module(leaf, linear)
    return root


def compress_linears(
    weights: Mapping[str, torch.Tensor], input_scale: Mapping[str, float], ignore: list[str]
) -> tuple[dict[str, torch.Tensor], object]:
    """The compressed tensors of ``weights`` (name -> float weight), and the compressor (for the config)."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import apply_quantization_config

    skeleton = _skeleton({name: weight.float() for name, weight in weights.items()})  # fp32 scales and math
    apply_quantization_config(skeleton, _scheme_config(ignore))
    for name, module in skeleton.named_modules():
        if isinstance(module, nn.Linear):
            # correctly rounded on any device (on a GPU, '/ 448' would multiply by a rounded inverse)
            module.weight_scale.data.copy_(divided(module.weight.detach().abs().amax(), E4M3_MAX))
            module.input_scale.data.fill_(input_scale[name + ".weight"])
    compressor = ModelCompressor.from_pretrained_model(skeleton, quantization_format="float-quantized")
    compressor.compress_model(skeleton)
    compressor.quantization_config.ignore = ignore
    state = {name: tensor.detach().cpu().contiguous() for name, tensor in skeleton.state_dict().items()}
    return state, compressor


def input_scales(names: list[str], table: Mapping[str, float] | None, default: float | None) -> dict[str, float]:
    """Each linear's input scale: its fused linear's scale in ``table``, else ``default``."""
    scales = {}
    for name in names:
        match = _text_linear(name)
        fused = f"layers.{match['layer']}.{FUSED[match['proj']]}"
        if table is not None and fused in table:
            scales[name] = float(table[fused])
        elif default is not None:
            scales[name] = default
        else:
            raise SystemExit(f"the scale table has no scale for {fused} (needed by {name})")
    return scales


def _shards(folder: Path) -> list[str]:
    index = folder / INDEX
    if index.exists():
        return sorted(set(json.loads(index.read_text())["weight_map"].values()))
    return ["model.safetensors"]


def write_shards(
    dst: Path,
    config: Mapping,
    shards: Iterable[tuple[str, dict[str, torch.Tensor]]],
    scales: Callable[[list[str]], Mapping[str, float]],
    *,
    index: bool,
) -> Path:
    """Write ``shards`` (file name, tensors by checkpoint name) into ``dst`` with their decoder linears compressed,
    ``config`` as ``config.json`` with compressed-tensors' ``quantization_config``, and the index when ``index``.
    ``scales`` gives the input scale of each linear of a shard, by name."""
    weight_map: dict[str, str] = {}
    ignored: set[str] = set()
    compressor = None
    total = 0
    for shard, tensors in shards:
        linears = {key: tensors.pop(key) for key in list(tensors) if _text_linear(key)}
        ignored.update(key.removesuffix(".weight") for key in tensors if LINEAR.match(key))
        ignored.update(m["module"] for key in tensors if (m := MEDIA_LINEAR.match(key)) and tensors[key].ndim == 2)
        if linears:
            state, compressor = compress_linears(linears, scales(list(linears)), [])
            tensors.update(state)
        tensors = {key: value.cpu().contiguous() for key, value in tensors.items()}
        save_file(tensors, str(dst / shard), metadata={"format": "pt"})
        total += sum(t.numel() * t.element_size() for t in tensors.values())
        weight_map.update(dict.fromkeys(tensors, shard))
        del tensors, linears
    if compressor is None:
        raise SystemExit(f"{dst}: the shards hold no Gemma 4 decoder linears to quantize")
    if index:
        body = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (dst / INDEX).write_text(json.dumps(body, indent=2) + "\n")
    (dst / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    # what a full model's compressed-tensors config says: the (tied) LM head and the other linears stay unquantized
    compressor.quantization_config.ignore = ["lm_head", *sorted(ignored)]
    compressor.update_config(str(dst))
    return dst


def write_fp8_static(
    src: str | Path,
    dst: str | Path,
    *,
    table: Mapping[str, float] | None = None,
    input_scale: float | None = None,
    device: str = "cpu",
) -> Path:
    """Write the fp8-static form of the checkpoint in ``src`` to ``dst`` (a new folder); returns ``dst``."""
    src, dst = Path(src), Path(dst)
    dst.mkdir(parents=True, exist_ok=False)
    for path in src.iterdir():  # tokenizer, generation config and the like, as they are
        if path.is_file() and path.suffix != ".safetensors" and path.name not in (INDEX, "config.json"):
            shutil.copy2(path, dst / path.name)

    def shards() -> Iterator[tuple[str, dict[str, torch.Tensor]]]:
        for shard in _shards(src):
            with safe_open(str(src / shard), framework="pt", device=device) as f:
                yield shard, {key: f.get_tensor(key) for key in f.keys()}

    config = json.loads((src / "config.json").read_text())
    return write_shards(
        dst, config, shards(), lambda names: input_scales(names, table, input_scale), index=(src / INDEX).exists()
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", type=Path)
    parser.add_argument("dst", type=Path)
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--table", type=Path, help="an fp8s scale table (its 'scales')")
    group.add_argument("--input-scale", type=float, help="one input scale for every linear")
    parser.add_argument("--device", default="cpu", help="where the compression runs (cuda is faster)")
    args = parser.parse_args()
    table = json.loads(args.table.read_text())["scales"] if args.table else None
    write_fp8_static(args.src, args.dst, table=table, input_scale=args.input_scale, device=args.device)
    print(args.dst)
    return 0


if __name__ == "__main__":
    sys.exit(main())
