"""The linears of int4 GPTQ checkpoints on the Qwen3.5 stack, in their modes (engine spec B.14.3, api spec §9.8); the
format check and the packed weights are `spinf.engine.qwen35.gptq`'s.

**Kept packed.** Every forward dequantizes the packed weights into its mode's representation, except where a GPU
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

import torch
from torch import nn

from spinf.engine.gemm import in_row_blocks, row_stable_mm, stable_mm
from spinf.engine.qwen35.gptq import ZERO, Int4Weight, unpack_gptq
from spinf.engine.qwen35.ops import MakeLinear, rms_norm
from spinf.engine.qwen35.outliers import NORM_FED, OUTLIERS_FILE
from spinf.errors import ModelError

MODES = ("i8", "f16", "fp8", "bf16")
ACT_BLOCK = 128  # input channels per activation scale in the block-scaled int8 linears
_FP8_MAX = 448.0
_GPU_INT_MM_ROWS = 32  # torch._int_mm on CUDA wants more than 16 rows
KEEP_RESERVE = 16 * 2**30  # `keep_unpacked`: bytes that must stay free after the unpacked int8 weights, at least
KEEP_SHARE = 0.25  # ... and this share of the GPU's memory (a 24 GB card keeps the weights packed)


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

    def forward(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """``x``'s product, written into ``out`` when given (by the product's kernel on a GPU in the ``i8`` mode)."""
        if x.is_cuda and self.mode == "i8":
            return self._gpu_i8(x, out=out)
        y = self._forward(x, self.weight()).to(x.dtype)
        return y if out is None else out.copy_(y)

    def keep_int8(self) -> int:
        """Unpack the i8 mode's int8 weight once and keep it beside the packed one (no unpacking per call, at the
        cost of one byte per weight); the bytes it takes. The same codes, so the same bits."""
        if self.int8 is None:
            self.int8 = self._gpu_weight(int8=True)
        return self.int8.numel()

    def plus(self, x: torch.Tensor, residual: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """``residual + self(x)``, written into ``out`` when given: on a GPU in the ``i8`` mode the product's kernel
        adds the residual as torch's ``+`` would (the product rounded to x's dtype first), so no [M, out] sum is
        launched apart; the same bits."""
        if x.is_cuda and self.mode == "i8" and residual.dtype == x.dtype:
            return self._gpu_i8(x, residual, out)
        y = residual + self(x)
        return y if out is None else out.copy_(y)

    def takes_blocks(self, x: torch.Tensor) -> bool:
        """Whether this linear's product of rows like ``x`` reads the block-scaled scheme's codes and scales
        (a GPU, the ``i8`` mode, no outlier channels), so the kernel that makes ``x`` can quantize them itself and
        hand them to `blocks_plus`."""
        return x.is_cuda and self.mode == "i8" and self.outliers is None and x.dtype in (torch.bfloat16, torch.float32)

    def blocks_plus(
        self,
        xq: torch.Tensor,
        x_scale: torch.Tensor,
        dtype: torch.dtype,
        residual: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``residual + self(x)`` (``self(x)`` without a residual) in ``dtype``, from x's block-scaled codes and
        scales (`spinf.engine.kernels.int4.quantize_blocks`'s, made by the kernel that made x): `plus`'s bits."""
        return self._i8_product(xq, x_scale, dtype, blocked=True, residual=residual, out=out)

    def normed(
        self, h: torch.Tensor, weight: torch.Tensor, eps: float, *, want_x: bool = False, out=None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``self(rms_norm(h, weight, eps))`` and the normed rows when ``want_x`` (else None, or them anyway): on
        a GPU in the ``i8`` mode with outlier channels (the norm-fed linears' split scheme) the norm runs inside
        the activations' quantizer (`spinf.engine.kernels.int4.norm_quantize_split`: the quantizer's bits for the
        normed rows it makes, row by row), and the normed rows reach memory only when asked for. The
        product goes into ``out`` when given (a contiguous [rows, out features] tensor of h's dtype; copied there
        off the GPU path)."""
        if (
            h.is_cuda
            and self.mode == "i8"
            and self.outliers is not None
            and h.dtype in (torch.bfloat16, torch.float32)
        ):
            from spinf.engine.kernels.int4 import norm_quantize_split

            x, xq, x_scale, x_out = norm_quantize_split(h, weight, eps, self.keep, self.outliers, want_x=want_x)
            y = self._i8_product(xq, x_scale, h.dtype, blocked=False, x_out=x_out, w_out=self.w_out, out=out)
            return y, x
        x = rms_norm(h, weight, eps)
        return self(x, out), x

    def _gpu_i8(
        self, x: torch.Tensor, residual: torch.Tensor | None = None, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The i8 mode through `spinf.engine.kernels.int4`, in x's dtype: the activations quantized in one pass as
        in `_split` / `_blocked`; the product and its epilogue in one kernel, over the weight unpacked per call (the
        checkpoint stays packed in memory) or kept unpacked (`keep_int8`): the same bits
        (tests/engine/qwen35/test_int4_kernels.py compares them with each other and with the torch code)."""
        xq, x_scale, scheme = self.gpu_quantized(x)
        return self._i8_product(xq, x_scale, x.dtype, residual=residual, out=out, **scheme)

    def _i8_product(self, xq: torch.Tensor, x_scale: torch.Tensor, dtype: torch.dtype, **kwargs) -> torch.Tensor:
        """`spinf.engine.kernels.int4.int8_mm` of quantized activations and this linear's int8 weight (kept, or
        unpacked for this call), ``kwargs`` its scheme and epilogue."""
        from spinf.engine.kernels.int4 import int8_mm

        wq = self.int8 if self.int8 is not None else self._gpu_weight(int8=True)
        return int8_mm(xq, x_scale, wq, self.w_scale, dtype, **kwargs)

    def gpu_quantized(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """``x`` quantized in one pass in this linear's i8 scheme (split where it has outlier channels, else
        block-scaled): the int8 codes, their scales, and the scheme's keyword arguments of `int8_mm`."""
        from spinf.engine.kernels.int4 import quantize_blocks, quantize_split

        if self.outliers is not None:
            xq, x_scale, x_out = quantize_split(x, self.keep, self.outliers)
            return xq, x_scale, {"blocked": False, "x_out": x_out, "w_out": self.w_out}
        xq, x_scale = quantize_blocks(x)
        return xq, x_scale, {"blocked": True}

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
