"""Int4 GPTQ checkpoints of the Qwen3.5 stack: the format check and the packed weights (engine spec B.14.3); the
linears that run them are `spinf.engine.qwen35.int4`'s.

**Checkpoint.** GPTQ v1 as gptqmodel, optimum and auto_gptq write it, with ``quantization_config`` at the top level
of config.json (or under ``text_config``): 4 bits, symmetric, no act-order, groups of ``group_size`` inputs (G
below: the config's, 128 when absent as in transformers' ``GPTQConfig``, the whole input width for ``-1``; 32 in
the published checkpoints; any even G that divides each quantized linear's input width). Per quantized linear:
``qweight`` int32 [in/8, out] (8 codes per word along the input, low bits first), ``qzeros`` int32 [in/G, out/8]
(the zero-point minus 1, packed the same way along the output: 7 everywhere for symmetric 4-bit, so every word is
0x77777777), ``scales`` fp16 [in/G, out] and ``g_idx`` int32 [in] (``i // G``); the weight is
``scales[g_idx[i], o] * (code[i, o] - 8)``. The decoder linears are quantized (attention q/k/v/o; the GDN's
in_proj_qkv, in_proj_z, out_proj; MLP gate/up/down); a linear with a plain ``.weight`` instead of a ``.qweight``
(the GDN's in_proj_b/a, anything a ``modules_to_not_convert`` or a ``dynamic`` exclusion left out) is read as float.
The config's other keys (``damp_percent``, ``meta``, ...) belong to the tool that wrote it and are not read.

**Kept packed.** ``q`` uint8 [out, in/2] (low nibble: the even input) and fp16 group ``scales`` [out, in/G];
every forward dequantizes (``w = s · (q − 8)``, exact in fp32) into its mode's representation, except where a GPU
with room keeps the ``i8`` mode's int8 weights unpacked beside them (`keep_unpacked`).

**Kept packed.** ``q`` uint8 [out, in/2] (low nibble: the even input) and fp16 group ``scales`` [out, in/G]
(`Int4Weight`); every forward dequantizes (``w = s · (q − 8)``, exact in fp32) into its mode's representation.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import attrs
import torch

from spinf.catalog.resolve import read_config
from spinf.errors import ModelError

GROUP = 32  # inputs per scale group in the published checkpoints (a checkpoint's own is its config's group_size)
DEFAULT_GROUP = 128  # transformers' GPTQConfig default, for a config without group_size
WHOLE_ROW = -1  # group_size for one group per output row (the whole input width)
BITS = 4
ZERO = 8  # the symmetric 4-bit zero-point; v1 stores it minus 1
STORED_ZEROS = 0x77777777  # a qzeros word of eight stored 7s


@attrs.frozen
class GptqConfig:
    """The checked ``quantization_config``; ``excluded`` are the names or patterns it says stay float (the tensors
    decide: a linear without ``.qweight`` is read as float)."""

    bits: int
    group_size: int
    excluded: tuple[str, ...] = ()


def read_gptq_config(folder: str | Path) -> GptqConfig | None:
    """The int4 GPTQ config of the checkpoint in ``folder``; None for a float checkpoint (no quantization_config);
    `ModelError` naming the field for anything but GPTQ v1, 4 bits, symmetric, no act-order, with a positive or
    whole-row (-1) group size (whether it divides each linear's input is checked as the tensors are read)."""
    path = Path(folder) / "config.json"
    raw = read_config(Path(folder))
    quant = raw.get("quantization_config", (raw.get("text_config") or {}).get("quantization_config"))
    if quant is None:
        return None
    if not isinstance(quant, dict):
        raise ModelError(f"{path}: quantization_config is not a JSON object")
    supported = "int4 GPTQ v1, symmetric, any group size, without act-order"
    if quant.get("desc_act", False) is True:
        raise ModelError(
            f"{path}: quantization_config.desc_act is True: act-order GPTQ checkpoints (whose g_idx permutes the "
            "input channels among the groups) are not supported; quantize with desc_act false"
        )

    def need(field: str, value: object, default: object) -> None:
        got = quant.get(field, default)
        if isinstance(got, str) and isinstance(value, str):
            got = got.lower()
        if got != value or type(got) is not type(value):
            raise ModelError(
                f"{path}: quantization_config.{field} is {got!r}; supported: {supported} ({field} {value!r})"
            )

    # transformers' GPTQConfig defaults for absent fields; "format" is the newer name of "checkpoint_format"
    need("quant_method", "gptq", None)
    need("bits", BITS, None)
    group_size = quant.get("group_size", DEFAULT_GROUP)
    if type(group_size) is not int or not (group_size > 0 or group_size == WHOLE_ROW):
        raise ModelError(
            f"{path}: quantization_config.group_size is {group_size!r}; supported: {supported} (a positive group "
            f"size, or {WHOLE_ROW} for whole rows)"
        )
    need("sym", True, True)
    need("desc_act", False, False)
    need("checkpoint_format", "gptq", "gptq")
    need("format", "gptq", "gptq")
    need("lm_head", False, False)
    excluded = list(quant.get("modules_to_not_convert") or [])
    for pattern, override in (quant.get("dynamic") or {}).items():
        if pattern.startswith("-:"):  # gptqmodel's negative rule: the matching modules are not quantized
            excluded.append(pattern[2:])
            continue
        for field, value in (("bits", BITS), ("group_size", group_size), ("sym", True), ("desc_act", False)):
            if field in (override or {}) and override[field] != value:
                raise ModelError(
                    f"{path}: quantization_config.dynamic[{pattern!r}] sets {field} {override[field]!r}; "
                    f"supported: {supported}"
                )
    return GptqConfig(bits=BITS, group_size=group_size, excluded=tuple(excluded))


@attrs.frozen
class Int4Weight:
    """A linear's int4 weight kept packed: ``q`` uint8 [out, in/2] (low nibble: even input), ``scales`` fp16
    [out, in/G] for groups of G inputs (`group`); ``w[o, i] = scales[o, i // G] · (q[o, i] − 8)``."""

    q: torch.Tensor
    scales: torch.Tensor

    def __attrs_post_init__(self):
        width, groups = 2 * self.q.shape[1], self.scales.shape[1]
        if self.scales.shape[0] != self.q.shape[0] or not groups or width % groups or (width // groups) % 2:
            raise ValueError(f"int4 scales {tuple(self.scales.shape)} do not group a {tuple(self.q.shape)} weight")

    @property
    def group(self) -> int:
        """Inputs per scale (even: a packed byte's two inputs share their scale)."""
        return 2 * self.q.shape[1] // self.scales.shape[1]

    def codes(self) -> torch.Tensor:
        """The 4-bit codes [out, in] as int16 (0..15)."""
        q = self.q.to(torch.int16)
        return torch.stack((q & 0xF, q >> 4), dim=-1).reshape(q.shape[0], -1)

    def dequantize(self) -> torch.Tensor:
        """The fp32 weight [out, in]; exact (an fp16 scale times an integer in [-8, 7] fits fp32's significand)."""
        codes = (self.codes() - ZERO).float()
        return (codes.view(codes.shape[0], -1, self.group) * self.scales.float()[..., None]).view(codes.shape)


def unpack_gptq(tensors: Mapping[str, torch.Tensor], name: str, group_size: int | None = None) -> Int4Weight:
    """The packed weight of linear ``name`` from its GPTQ v1 ``qweight``, ``qzeros``, ``scales`` and ``g_idx``, in
    groups of ``group_size`` inputs (the config's; `WHOLE_ROW` for the input width; None: as many as the scales'
    rows imply); `ModelError` naming the tensor for a shape or dtype off the format, a group that does not divide
    the input width, a zero-point other than 7 or act-order."""
    try:
        qweight, qzeros, scales = (tensors[f"{name}.{part}"] for part in ("qweight", "qzeros", "scales"))
    except KeyError as exc:
        raise ModelError(f"the int4 checkpoint has no tensor {exc.args[0]}") from exc
    words, out = qweight.shape
    width = words * 32 // BITS
    if group_size is None:  # the scales' rows count the groups
        rows = scales.shape[0]
        group_size = width // rows if rows and width % rows == 0 else 0
    group = _group(name, width, group_size)
    expected = {
        "qweight": (torch.int32, (words, out)),
        "qzeros": (torch.int32, (width // group, out * BITS // 32)),
        "scales": (torch.float16, (width // group, out)),
        "g_idx": (torch.int32, (width,)),
    }
    for part, (dtype, shape) in expected.items():
        tensor = tensors.get(f"{name}.{part}")
        if tensor is None:  # only g_idx may be absent (it is implied)
            continue
        if tensor.dtype != dtype or tuple(tensor.shape) != shape or out % 8:
            raise ModelError(
                f"{name}.{part}: {tensor.dtype} {tuple(tensor.shape)}, expected {dtype} {shape} (GPTQ v1 int4, "
                f"group {group}, {width} inputs, {out} outputs)"
            )
    bad = (qzeros != STORED_ZEROS).nonzero()
    if len(bad):
        group, column = bad[0].tolist()
        stored = [(int(qzeros[group, column]) >> (4 * j)) & 0xF for j in range(8)]
        raise ModelError(
            f"{name}.qzeros: stored zero-points {stored} at group {group}, outputs {8 * column}..{8 * column + 7}; "
            f"a symmetric int4 GPTQ v1 checkpoint stores 7 (zero-point 8) everywhere"
        )
    g_idx = tensors.get(f"{name}.g_idx")
    if g_idx is not None and not torch.equal(
        g_idx, torch.arange(width, dtype=torch.int32, device=g_idx.device) // group
    ):
        raise ModelError(f"{name}.g_idx: not i // {group} (act-order or another group size is not supported)")
    shifts = torch.arange(0, 32, BITS, dtype=torch.int32, device=qweight.device)
    codes = ((qweight[:, None, :] >> shifts[None, :, None]) & 0xF).reshape(width, out).t()  # [out, in]
    q = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)
    return Int4Weight(q=q.contiguous(), scales=scales.t().contiguous())


def _group(name: str, width: int, group_size: int) -> int:
    """The inputs per group of a linear ``width`` inputs wide (`WHOLE_ROW`: all of them) when ``group_size`` is
    even and divides the width, else `ModelError`."""
    group = width if group_size == WHOLE_ROW else group_size
    if group <= 0 or width % group or group % 2:
        raise ModelError(
            f"{name}: group size {group_size} does not divide its {width} inputs into even groups (GPTQ int4 "
            "needs an even group size that divides every quantized linear's input width, or -1 for whole rows)"
        )
    return group
