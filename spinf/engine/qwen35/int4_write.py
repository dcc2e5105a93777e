"""Writing an int4 GPTQ v1 checkpoint of a float Qwen3.5 checkpoint, with its outlier table (engine spec B.14.3):
for the tests, and for making small int4 models in the real layout (`spinf.engine.qwen35.int4`).

The decoder linears are quantized by symmetric round-to-nearest per group of inputs (32 unless asked: the
checkpoint's ``group_size``, -1 for whole rows), with GPTQ's own symmetric grid: scale ``2 · amax / 15`` and
zero-point 8, codes ``clamp(round(w / s) + 8, 0, 15)`` (gptqmodel's quantizer computes ``(xmax − xmin) / maxq``
with ``xmin = −xmax``). All 16 levels ``s · [−8, 7]`` are used; the group's largest positive weight (7.5 steps)
clamps to 7 steps, an error of half a step like any rounding. ``amax / 7`` would leave the −8 level unused and make
every step 7.5/7 as coarse. The scale is rounded to fp16 (as stored) before the codes are taken, so ``s · (q − 8)``
is the value nearest to w on the stored grid. No GPTQ error
compensation: round-to-nearest is enough for a test model, and it is deterministic.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from spinf.catalog.resolve import read_config
from spinf.engine.folder import read_tensors
from spinf.engine.layout import build_pass
from spinf.engine.qwen35.config import FULL, read_qwen35_config
from spinf.engine.qwen35.gptq import BITS, GROUP, STORED_ZEROS, WHOLE_ROW, ZERO
from spinf.engine.qwen35.model import load_qwen35
from spinf.engine.qwen35.outliers import OUTLIERS_FILE, OUTLIERS_VERSION, norm_fed_names
from spinf.engine.qwen35.readout import has_readout, read_readout
from spinf.engine.trie import Job
from spinf.errors import ModelError

CALIBRATION_TOKENS = 512  # the default calibration stream's length (drawn with `_CALIBRATION_SEED`)
_CALIBRATION_SEED = 0
# the quantization_config a GPTQ v1 writer puts in config.json (gptqmodel's and transformers' GPTQConfig field names)
QUANTIZATION_CONFIG = {
    "bits": BITS,
    "group_size": GROUP,
    "desc_act": False,
    "sym": True,
    "lm_head": False,
    "quant_method": "gptq",
    "format": "gptq",
    "checkpoint_format": "gptq",
    "pack_dtype": "int32",
    "true_sequential": True,
    "meta": {"quantizer": ["spinf:rtn"]},
}


def quantized_names(layer_types: Sequence[str], prefix: str) -> list[str]:
    """The full names (without ``.weight``) of the linears an int4 checkpoint quantizes."""
    names = []
    for i, kind in enumerate(layer_types):
        at = f"{prefix}layers.{i}."
        if kind == FULL:
            names += [at + f"self_attn.{n}" for n in ("q_proj", "k_proj", "v_proj", "o_proj")]
        else:
            names += [at + f"linear_attn.{n}" for n in ("in_proj_qkv", "in_proj_z", "out_proj")]
        names += [at + f"mlp.{n}" for n in ("gate_proj", "up_proj", "down_proj")]
    return names


def quantize_rtn(weight: torch.Tensor, group_size: int = GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric round-to-nearest of ``weight`` [out, in] per group of ``group_size`` inputs (`WHOLE_ROW`: the
    whole row): the codes [out, in] (int32, 0..15, zero-point 8) and the fp16 scales [out, in/G] (see the module
    docstring)."""
    out, width = weight.shape
    group = width if group_size == WHOLE_ROW else group_size
    if group <= 0 or width % group:
        raise ModelError(f"group size {group_size} does not divide a {out} x {width} weight's inputs")
    groups = weight.float().reshape(out, width // group, group)
    amax = groups.abs().amax(dim=-1)
    amax = torch.where(amax > 0, amax, torch.ones_like(amax))  # an all-zero group: GPTQ's ±1 range
    scales = (2 * amax / 15).to(torch.float16)
    codes = torch.round(groups / scales.float()[..., None]) + ZERO
    return codes.clamp_(0, 15).to(torch.int32).reshape(out, width), scales


def pack_gptq(codes: torch.Tensor, scales: torch.Tensor) -> dict[str, torch.Tensor]:
    """GPTQ v1 tensors of codes [out, in] (0..15) and fp16 scales [out, in/G] (groups of G inputs): ``qweight``
    int32 [in/8, out] (eight codes per word along the input, the first in the low bits), ``qzeros`` int32
    [in/G, out/8] (zero-point 8 stored as 7, eight per word along the output), ``scales`` fp16 [in/G, out],
    ``g_idx`` int32 [in] (``i // G``)."""
    out, width = codes.shape
    groups = scales.shape[1]
    if width % 8 or width % groups or out % 8:
        raise ModelError(
            f"a {out} x {width} weight does not pack as int4 GPTQ in {groups} groups (inputs by 8, outputs by 8)"
        )
    group = width // groups
    shifts = np.arange(0, 32, BITS, dtype=np.uint32)[None, :, None]
    nibbles = codes.t().numpy().astype(np.uint32).reshape(width // 8, 8, out)
    qweight = np.bitwise_or.reduce(nibbles << shifts, axis=1).view(np.int32)
    zeros = np.full((groups, out // 8), STORED_ZEROS, dtype=np.uint32).view(np.int32)
    return {
        "qweight": torch.from_numpy(np.ascontiguousarray(qweight)),
        "qzeros": torch.from_numpy(zeros),
        "scales": scales.t().contiguous(),
        "g_idx": torch.arange(width, dtype=torch.int32) // group,
    }


def measure_outliers(source: Path, channels: int, tokens: Sequence[int]) -> dict[str, list[int]]:
    """Per norm-fed linear of the float checkpoint in ``source`` (run over ``tokens`` as one stream), the
    ``channels`` input channels with the largest max |activation|, ascending; ties go to the lower channel.

    The model runs in fp32, the CPU stack's only dtype (its recurrence does not run in bf16); the production table
    was measured in bf16 (engine spec B.14.3), which moves the peaks by rounding only."""
    head = None  # a decider has no LM head; its readout stands in (the table needs the decoder's inputs only)
    if has_readout(source):
        cfg = read_qwen35_config(source)[0]
        head = read_readout(source, hidden_size=cfg.hidden_size, vocab_size=cfg.vocab_size)
    model = load_qwen35(source, readout=head)
    cfg, prefix = model.cfg, read_qwen35_config(source)[1]
    if not 0 < channels < cfg.hidden_size:
        raise ValueError(f"outlier_channels {channels} is not between 1 and the hidden size {cfg.hidden_size} - 1")
    peaks: dict[str, torch.Tensor] = {}
    hooks = []
    names = iter(norm_fed_names(cfg.layer_types, prefix))
    for layer in model.layers:
        mixer_in = layer.mixer.wqkv if layer.is_attention else layer.mixer.w_in
        for module in (mixer_in, layer.w_gate_up):
            name = next(names)

            def keep(_module, args, name=name):
                peak = args[0].detach().abs().float().amax(dim=0)
                peaks[name] = torch.maximum(peaks[name], peak) if name in peaks else peak

            hooks.append(module.register_forward_pre_hook(keep))
    layout = build_pass([Job(tuple(int(t) for t in tokens))])
    try:
        with torch.inference_mode():
            model(torch.tensor(layout.token_ids, dtype=torch.long), model.plan(layout))
    finally:
        for hook in hooks:
            hook.remove()
    table = {}
    for name, peak in peaks.items():
        order = np.argsort(-peak.numpy(), kind="stable")  # stable: equal peaks keep channel order
        table[name] = sorted(int(c) for c in order[:channels])
    return table


def write_gptq_checkpoint(
    source_folder: str | Path,
    dest_folder: str | Path,
    *,
    outlier_channels: int,
    calibration_tokens: Sequence[int] | None = None,
    group_size: int = GROUP,
    quantization_config: dict | None = None,
) -> Path:
    """Write an int4 GPTQ v1 checkpoint of the float Qwen3.5 checkpoint in ``source_folder`` into ``dest_folder``
    (created if needed) and return it: the decoder linears quantized (`quantize_rtn`, `pack_gptq`) in groups of
    ``group_size`` inputs (`WHOLE_ROW`: whole rows), every other tensor as it is, ``quantization_config`` (None:
    `QUANTIZATION_CONFIG`; its ``group_size`` set to ``group_size`` either way) in config.json and
    quantize_config.json, the source's other files
    (tokenizer, generation config, a decider's readout) copied, and `OUTLIERS_FILE` (our format) with
    ``outlier_channels`` channels per norm-fed linear measured over ``calibration_tokens`` (None:
    `CALIBRATION_TOKENS` seeded random ids). The same source gives the same bytes."""
    source, dest = Path(source_folder), Path(dest_folder)
    cfg, prefix = read_qwen35_config(source)
    if calibration_tokens is None:
        generator = torch.Generator().manual_seed(_CALIBRATION_SEED)
        calibration_tokens = torch.randint(3, cfg.vocab_size, (CALIBRATION_TOKENS,), generator=generator).tolist()
    outliers = measure_outliers(source, outlier_channels, calibration_tokens)
    raw = read_tensors(source, "")
    tensors = {}
    for name in quantized_names(cfg.layer_types, prefix):
        weight = raw.pop(f"{name}.weight", None)
        if weight is None:
            raise ModelError(f"{source}: the checkpoint has no tensor {name}.weight")
        packed = pack_gptq(*quantize_rtn(weight, group_size))
        tensors |= {f"{name}.{part}": tensor for part, tensor in packed.items()}
    tensors |= {name: tensor.contiguous() for name, tensor in raw.items()}
    dest.mkdir(parents=True, exist_ok=True)
    save_file(dict(sorted(tensors.items())), str(dest / "model.safetensors"), metadata={"format": "pt"})
    # as gptqmodel saves: quantize_config.json, and the same object as config.json's quantization_config
    quantization = (QUANTIZATION_CONFIG if quantization_config is None else quantization_config) | {
        "group_size": group_size
    }
    (dest / "quantize_config.json").write_text(json.dumps(quantization, indent=2) + "\n")
    config = read_config(source) | {"quantization_config": quantization}
    (dest / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    table = {
        "format_version": OUTLIERS_VERSION,
        "channels": outlier_channels,
        "linears": outliers,
        "calibration": {"tokens": len(calibration_tokens), "dtype": "float32"},
    }
    (dest / OUTLIERS_FILE).write_text(json.dumps(table, indent=1) + "\n")
    for path in sorted(source.iterdir()):  # a decider's readout.safetensors is copied: it is no weight shard
        weights = path.match("model*.safetensors") or path.name == "model.safetensors.index.json"
        if path.is_file() and not weights and path.name not in ("config.json", "quantize_config.json", OUTLIERS_FILE):
            shutil.copyfile(path, dest / path.name)
    return dest
