"""Int4 GPTQ checkpoints of the Qwen3.5 stack: the format check, the packed weights and the linears' modes (engine
spec B.14.3, api spec §9.8).

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

**Modes** (the scheme is reported as ``int4-<mode>``). Each one's rows are invariant on the CPU: a row's output bits
depend on that row alone (scales per token only, float products in fixed row blocks through `row_stable_mm`,
integer products exact through ``torch._int_mm``, which CPU torch has):

* ``bf16``: weight and activation in bf16, a bf16 GEMM (fp32 accumulation, bf16 result).
* ``f16``: the same in fp16. On a GPU the fp16 GEMM accumulates in fp16 when the engine sets
  ``torch.backends.cuda.matmul.allow_fp16_accumulation`` (not set here); the CPU emulation accumulates in fp32.
* ``fp8``: e4m3 with one weight scale per tensor (``amax/448``) and, so that rows stay independent, one activation
  scale per token (a per-tensor activation scale would make every row depend on the others).
* ``i8`` (production): the weight dequantized to int8 per output channel, ``round(s_g · (q − 8) · 127 / amax_row)``.
  The norm-fed linears (GDN in_proj_qkv+z, attention q/k/v, MLP gate/up: recognised by the first name of the fused
  group) use the split scheme: the activation is quantized per token to int8 over all channels except the calibrated
  outlier channels, which are zeroed in the int8 copy and kept in fp16; the int8 products are summed exactly in
  int32, both scales applied, and the fp16 outlier product ``x_out · w_outᵀ`` (fp32 accumulation) added. The others
  (GDN out_proj, attention o_proj, MLP down) quantize the activation per (token, 128-channel block), the last block
  narrower when the width is no multiple of 128, sum each block exactly in int32 and the blocks in fp32 in ascending
  order, then apply the weight's per-channel scale.

**Outlier table** (`spinf.engine.qwen35.outliers`, needed by ``i8``): per norm-fed group, keyed by its first full
weight name, the input channels whose max |activation| over a calibration stream was largest; read in our format
and in spinf-serve 0.1.1's, which the published checkpoints ship.

On a GPU the weights are unpacked per call by `spinf.engine.kernels.int4` (the ``i8`` mode's int8 codes, or the
fp32 weight of the others), unless `keep_unpacked` kept the int8 ones; the ``i8`` activations are quantized in one
kernel of that module and the products and their epilogues run in another, which computes what the torch code here
states (the fp16 outlier product sums in another order); the other modes' products run through fp16/bf16 ``mm``
and ``torch._scaled_mm`` with row-wise scales, on blocks of a fixed row count (cuBLAS picks its kernel by the row
count, so a row's bits would otherwise depend on how many rows share the pass).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import attrs
import torch
from torch import nn

from spinf.catalog.resolve import read_config
from spinf.engine.gemm import in_row_blocks, row_stable_mm, stable_mm
from spinf.engine.qwen35.model import MakeLinear

# the outlier table's names, which lived here before `spinf.engine.qwen35.outliers` (benchmarks import them from here)
from spinf.engine.qwen35.outliers import NORM_FED, OUTLIERS_FILE
from spinf.engine.qwen35.outliers import OUTLIERS_VERSION as OUTLIERS_VERSION
from spinf.engine.qwen35.outliers import norm_fed_names as norm_fed_names
from spinf.engine.qwen35.outliers import read_outliers as read_outliers
from spinf.errors import ModelError

GROUP = 32  # inputs per scale group in the published checkpoints (a checkpoint's own is its config's group_size)
DEFAULT_GROUP = 128  # transformers' GPTQConfig default, for a config without group_size
WHOLE_ROW = -1  # group_size for one group per output row (the whole input width)
BITS = 4
ZERO = 8  # the symmetric 4-bit zero-point; v1 stores it minus 1
STORED_ZEROS = 0x77777777  # a qzeros word of eight stored 7s
MODES = ("i8", "f16", "fp8", "bf16")
DEFAULT_MODE = "i8"  # api spec §9.8
ACT_BLOCK = 128  # input channels per activation scale in the block-scaled int8 linears
_FP8_MAX = 448.0
_GPU_INT_MM_ROWS = 32  # torch._int_mm on CUDA wants more than 16 rows
KEEP_RESERVE = 16 * 2**30  # `keep_unpacked`: bytes that must stay free after the unpacked int8 weights, at least
KEEP_SHARE = 0.25  # ... and this share of the GPU's memory (a 24 GB card keeps the weights packed)


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


def _per_token(x: torch.Tensor, top: float) -> torch.Tensor:
    """Each row's scale ``amax / top`` [rows, 1] (1 for a zero row, whose codes are all zero anyway)."""
    amax = x.abs().amax(dim=-1, keepdim=True)
    return torch.where(amax > 0, _divide(amax, top), torch.ones_like(amax))


def _divide(x: torch.Tensor, by: float) -> torch.Tensor:
    """``x / by`` correctly rounded on every device: CUDA torch divides by a Python number as ``x · (1 / by)``, one
    ulp off at times, which moved int8 codes against the CPU's; a divisor tensor on x's device is divided."""
    return x / torch.full((), by, dtype=x.dtype, device=x.device)  # filled on the device: no host copy per call


def _to_int8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return torch.round(x / scale).clamp_(-127, 127).to(torch.int8)


def _int_mm(a: torch.Tensor, b_t: torch.Tensor) -> torch.Tensor:
    """Exact int32 ``a @ b_t`` of int8 [M, K] and [K, N] (no rounding, so no row depends on another)."""
    rows = a.shape[0]
    if a.is_cuda:  # cuBLASLt's int8 kernel refused 51 and 56 rows on the H200: whole blocks of 32 (zeros add nothing)
        padded = -(-rows // _GPU_INT_MM_ROWS) * _GPU_INT_MM_ROWS
        if padded != rows:
            a = torch.cat([a, a.new_zeros((padded - rows, a.shape[1]))])
    return torch._int_mm(a.contiguous(), b_t)[:rows]


def _bf16(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return stable_mm(x.to(torch.bfloat16), w.to(torch.bfloat16))  # fixed row blocks on the GPU too


def _f16(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    x, w = x.to(torch.float16), w.to(torch.float16)
    if x.is_cuda:  # fixed row blocks, as `_bf16`: cuBLAS picks kernels by the row count
        return stable_mm(x, w)
    return row_stable_mm(x.float(), w.float()).to(torch.float16)  # CPU: fp32 accumulation, the fp16 result


def _fp8(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    w_scale = (w.abs().amax().clamp(min=torch.finfo(torch.float32).tiny) / _FP8_MAX).float()
    w8 = (w / w_scale).clamp(-_FP8_MAX, _FP8_MAX).to(torch.float8_e4m3fn)

    def product(xf: torch.Tensor) -> torch.Tensor:
        x_scale = _per_token(xf, _FP8_MAX)  # zero rows get scale 1
        x8 = (xf / x_scale).clamp(-_FP8_MAX, _FP8_MAX).to(torch.float8_e4m3fn)
        if not x.is_cuda:  # e4m3 products are exact in fp32; the sums run in fixed row blocks
            return row_stable_mm(x8.float(), w8.float()) * x_scale * w_scale
        b_scale = w_scale.reshape(1, 1).expand(1, w.shape[0]).contiguous()  # row-wise scales [M, 1] and [1, N]
        return torch._scaled_mm(x8, w8.t(), scale_a=x_scale, scale_b=b_scale, out_dtype=torch.bfloat16)

    # on a GPU, blocks of a fixed row count (cuBLAS picks kernels by the row count, and wants whole 16-row tiles)
    return in_row_blocks(x.float(), product) if x.is_cuda else product(x.float())


class Int4Linear(nn.Module):
    """A fused linear of int4 (and float) parts in one mode: ``forward(x [M, in]) -> [M, out]`` in x's dtype.

    ``parts`` are fused along the output in order; ``outliers`` (``i8`` only) are the input channels of the split
    scheme, None for the block-scaled one."""

    def __init__(self, parts: Sequence[Int4Weight | torch.Tensor], mode: str, outliers: Sequence[int] | None = None):
        super().__init__()
        self.mode = mode
        self.kinds = []
        for index, part in enumerate(_merge_int4(parts)):
            if isinstance(part, Int4Weight):
                self.register_buffer(f"q{index}", part.q, persistent=False)
                self.register_buffer(f"s{index}", part.scales, persistent=False)
                self.kinds.append("int4")
            else:
                self.register_buffer(f"w{index}", part.float(), persistent=False)
                self.kinds.append("float")
        idx = None if outliers is None else torch.tensor(sorted(outliers), dtype=torch.long, device=self._device())
        self.register_buffer("outliers", idx, persistent=False)
        # each output row's largest |weight| (1 for an all-zero row): the i8 mode's per-channel scale is amax / 127
        amax = self._row_amax() if mode == "i8" else None
        self.register_buffer("amax", amax, persistent=False)
        self.register_buffer("w_scale", None if amax is None else _divide(amax, 127), persistent=False)
        # the GPU's i8 forward (`_gpu_i8`): the split scheme's inlier mask and fp16 outlier columns, made once
        keep = None
        if mode == "i8" and idx is not None:
            keep = torch.ones(self.in_features, dtype=torch.int8, device=idx.device).index_fill_(0, idx, 0)
        self.register_buffer("keep", keep, persistent=False)
        w_out = self._columns(idx).to(torch.float16) if keep is not None else None
        self.register_buffer("w_out", w_out, persistent=False)
        self.register_buffer("int8", None, persistent=False)  # the unpacked int8 weight when kept (`keep_int8`)
        self._forward: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = {
            "bf16": _bf16,
            "f16": _f16,
            "fp8": _fp8,
            "i8": self._split if outliers is not None else self._blocked,
        }[mode]

    def _device(self) -> torch.device:
        return next(self.buffers()).device

    def _parts(self):
        """(kind, first output row, the part's tensors) for each fused part."""
        row0 = 0
        for index, kind in enumerate(self.kinds):
            part = (
                (getattr(self, f"q{index}"), getattr(self, f"s{index}"))
                if kind == "int4"
                else getattr(self, f"w{index}")
            )
            yield kind, row0, part
            row0 += part[0].shape[0] if kind == "int4" else part.shape[0]

    def _row_amax(self) -> torch.Tensor:
        """Each output row's largest |weight| in fp32 [out], 1 for an all-zero row: for an int4 part the largest
        ``|s_g| · |q − 8|`` over its groups (the products are exact, so this is the largest |w| of the row)."""
        rows = []
        for kind, _, part in self._parts():
            if kind == "int4":
                q, scales = part
                weight = Int4Weight(q, scales)
                codes = (weight.codes() - ZERO).abs().view(q.shape[0], -1, weight.group)
                rows.append((codes.amax(dim=-1).float() * scales.float().abs()).amax(dim=-1))
            else:
                rows.append(part.abs().amax(dim=1))
        amax = torch.cat(rows)
        return torch.where(amax > 0, amax, torch.ones_like(amax))

    def _gpu_weight(self, int8: bool) -> torch.Tensor:
        """The fused weight [out, in] on the GPU by `spinf.engine.kernels.int4.unpack_int4`: the i8 mode's int8
        codes (``int8``), else fp32; the same values as `weight` and `_int8_weight` compute in torch."""
        from spinf.engine.kernels.int4 import unpack_int4

        width = self.in_features
        out = torch.empty(
            (self.out_features, width), dtype=torch.int8 if int8 else torch.float32, device=self._device()
        )
        for kind, row0, part in self._parts():
            if kind == "int4":
                q, scales = part
                unpack_int4(q, scales, out, row0, self.amax[row0 : row0 + q.shape[0]] if int8 else None)
            elif int8:
                amax = self.amax[row0 : row0 + part.shape[0], None]
                out[row0 : row0 + part.shape[0]] = torch.round(part * 127 / amax).to(torch.int8)
            else:
                out[row0 : row0 + part.shape[0]] = part
        return out

    def _columns(self, channels: torch.Tensor) -> torch.Tensor:
        """The fused fp32 weight's input columns ``channels`` [out, len(channels)], without unpacking the rest."""
        cols = []
        for kind, _, part in self._parts():
            if kind == "int4":
                q, scales = part
                group = Int4Weight(q, scales).group
                codes = (q.index_select(1, channels // 2).to(torch.int16) >> (4 * (channels % 2))) & 0xF
                cols.append((codes - ZERO).float() * scales.index_select(1, channels // group).float())
            else:
                cols.append(part.index_select(1, channels))
        return torch.cat(cols)

    @property
    def in_features(self) -> int:
        kind, _, part = next(self._parts())
        return 2 * part[0].shape[1] if kind == "int4" else part.shape[1]

    def weight(self) -> torch.Tensor:
        """The fused fp32 weight [out, in], the int4 parts dequantized."""
        if self._device().type == "cuda":
            return self._gpu_weight(int8=False)
        return torch.cat(
            [Int4Weight(*part).dequantize() if kind == "int4" else part for kind, _, part in self._parts()]
        )

    @property
    def out_features(self) -> int:
        return sum((part[0] if kind == "int4" else part).shape[0] for kind, _, part in self._parts())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda and self.mode == "i8":
            return self._gpu_i8(x)
        return self._forward(x, self.weight()).to(x.dtype)

    def keep_int8(self) -> int:
        """Unpack the i8 mode's int8 weight once and keep it beside the packed one (no unpacking per call, at the
        cost of one byte per weight); the bytes it takes. The same codes, so the same bits."""
        if self.int8 is None:
            self.int8 = self._gpu_weight(int8=True)
        return self.int8.numel()

    def _gpu_i8(self, x: torch.Tensor) -> torch.Tensor:
        """The i8 mode through `spinf.engine.kernels.int4`, in x's dtype: the activations quantized in one pass as
        in `_split` / `_blocked`; the product and its epilogue in one kernel, over the weight unpacked per call (the
        checkpoint stays packed in memory) or kept unpacked (`keep_int8`): the same bits
        (tests/engine/qwen35/test_int4_kernels.py compares them with each other and with the torch code)."""
        from spinf.engine.kernels.int4 import int8_mm, quantize_blocks, quantize_split

        if self.outliers is not None:
            xq, x_scale, x_out = quantize_split(x, self.keep, self.outliers)
            scheme = {"blocked": False, "x_out": x_out, "w_out": self.w_out}
        else:
            xq, x_scale = quantize_blocks(x)
            scheme = {"blocked": True}
        wq = self.int8 if self.int8 is not None else self._gpu_weight(int8=True)
        return int8_mm(xq, x_scale, wq, self.w_scale, x.dtype, **scheme)

    @staticmethod
    def _int8_weight(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The weight in int8 per output channel [out, in] and its scales [1, out]: ``round(w · 127 / amax_row)``."""
        amax = w.abs().amax(dim=1, keepdim=True)
        amax = torch.where(amax > 0, amax, torch.ones_like(amax))
        return torch.round(w * 127 / amax).to(torch.int8), (amax / 127).t()

    def _split(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        wq, w_scale = self._int8_weight(w)
        xf = x.float()
        inliers = xf.index_fill(1, self.outliers, 0.0)  # the outlier channels zeroed in the int8 copy
        x_scale = _per_token(inliers, 127.0)
        exact = _int_mm(_to_int8(inliers, x_scale), wq.t().contiguous())  # [M, out] int32
        x_out = xf.index_select(1, self.outliers).to(torch.float16)
        w_out = self.w_out  # the weight's outlier columns in fp16, made once at load
        outlier = row_stable_mm(x_out.float(), w_out.float())  # fp16 values, fp32 accumulation
        return exact.float() * x_scale * w_scale + outlier

    def _blocked(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        wq, w_scale = self._int8_weight(w)
        xf = x.float()
        acc = xf.new_zeros((x.shape[0], w.shape[0]))
        for start in range(0, x.shape[1], ACT_BLOCK):  # ascending: the fp32 sum's order is fixed
            block = xf[:, start : start + ACT_BLOCK]
            scale = _per_token(block, 127.0)
            acc += _int_mm(_to_int8(block, scale), wq[:, start : start + ACT_BLOCK].t().contiguous()).float() * scale
        return acc * w_scale


def _merge_int4(parts: Sequence[Int4Weight | torch.Tensor]) -> list[Int4Weight | torch.Tensor]:
    """``parts`` with each run of int4 parts of one group size fused into one (their rows in order): one packed
    weight and one unpacking launch per run."""
    merged: list[Int4Weight | torch.Tensor] = []
    for part in parts:
        last = merged[-1] if merged else None
        if isinstance(part, Int4Weight) and isinstance(last, Int4Weight) and last.group == part.group:
            merged.pop()
            part = Int4Weight(torch.cat([last.q, part.q]), torch.cat([last.scales, part.scales]))
        merged.append(part)
    return merged


def keep_unpacked(model: nn.Module, device: torch.device) -> int:
    """Keep every i8 linear of ``model`` unpacked (`Int4Linear.keep_int8`) when the GPU has room for it: after the
    int8 weights (one byte per weight: 25 GB at the 27B) at least `KEEP_RESERVE` bytes and `KEEP_SHARE` of the
    GPU's memory must stay free for the engine's passes; a process memory cap
    (``torch.cuda.set_per_process_memory_fraction``) counts. The bits do not change, only the time: no unpacking
    per call (the 27B's MLP gate/up at 16 rows on the H200: 0.14 ms kept, 0.77 ms unpacked per call). The bytes
    kept, 0 when it did not fit."""
    linears = [m for m in model.modules() if isinstance(m, Int4Linear) and m.mode == "i8"]
    need = sum(linear.out_features * linear.in_features for linear in linears)
    device = torch.device(device)
    if not need or device.type != "cuda":
        return 0
    index = torch.cuda.current_device() if device.index is None else device.index  # the cap is asked by index
    free, total = torch.cuda.mem_get_info(index)
    limit = torch.cuda.get_per_process_memory_fraction(index) * total
    free = min(free, limit - torch.cuda.memory_reserved(index))
    if free - need < max(KEEP_RESERVE, KEEP_SHARE * limit):
        return 0
    for linear in linears:
        linear.keep_int8()
    return need


def check_mode(mode: str) -> str:
    """``mode`` if int4 checkpoints run it (api spec §9.8), else `ModelError`."""
    if mode not in MODES:
        raise ModelError(f"an int4 checkpoint runs the quant modes {', '.join(MODES)}, not {mode!r} (api spec §9.8)")
    return mode


def scheme(mode: str) -> str:
    """The quant scheme an int4 checkpoint reports in ``mode`` (api spec §9.8): ``int4-<mode>``."""
    return f"int4-{check_mode(mode)}"


def int4_linears(
    raw: Mapping[str, torch.Tensor],
    mode: str,
    outliers: Mapping[str, Sequence[int]] | None = None,
    device: str | torch.device = "cpu",
    group_size: int | None = None,
) -> MakeLinear:
    """`MakeLinear` for an int4 GPTQ checkpoint whose tensors (by full name) are ``raw``, in ``mode``; ``outliers``
    is the checkpoint's outlier table (`read_outliers`), needed by ``i8``; ``group_size`` its config's (`unpack_gptq`:
    None takes each linear's from its scales). Each linear is unpacked and kept on
    ``device`` (a GPU unpacks the 27B's linears in seconds). Each name is read as int4 when it has a ``.qweight``,
    as float when it has a ``.weight``; the parts are fused along the output (`Int4Linear`)."""
    check_mode(mode)
    if mode == "i8" and outliers is None:
        raise ModelError(
            f"the int4 i8 mode needs the checkpoint's outlier table ({OUTLIERS_FILE}), which is missing "
            "(engine spec B.14.3); run another mode (f16, fp8, bf16) or add the table"
        )

    def make(names: list[str]) -> nn.Module:
        parts: list[Int4Weight | torch.Tensor] = []
        for name in names:
            if f"{name}.qweight" in raw:
                fields = (f"{name}.{part}" for part in ("qweight", "qzeros", "scales", "g_idx"))
                tensors = {key: raw[key].to(device) for key in fields if key in raw}
                parts.append(unpack_gptq(tensors, name, group_size))
            elif f"{name}.weight" in raw:
                parts.append(raw[f"{name}.weight"].to(device))
            else:
                raise ModelError(f"the int4 checkpoint has neither {name}.qweight nor {name}.weight")
        channels = None
        if mode == "i8" and names[0].endswith(NORM_FED):
            if names[0] not in outliers:
                raise ModelError(f"the outlier table ({OUTLIERS_FILE}) has no entry for {names[0]}")
            channels = outliers[names[0]]
        return Int4Linear(parts, mode, channels)

    return make
