"""One Gemma 4 decoder layer as the engine runs it (`spinf.engine.gemma4.model` stacks them): the plain torch path
(`DecoderLayer.forward`, the CPU and calibration) and, on a GPU with bf16 activations, the same arithmetic through
the Triton kernels of `spinf.engine.kernels` (`DecoderLayer._forward_fused`); its linears stored as they run
(float, fp8s with static input scales, or an on-the-fly scheme of `spinf.engine.schemes`).

The small models' (E2B/E4B) per-layer input is gated into each layer's output (`DecoderLayer.per_layer_projection`);
their KV-shared layers compute no keys and values and attend with those the last non-shared layer of their kind made
for the same rows of the pass (`DecoderLayer._exchange_kv`). Their small linears (the per-layer gate and projection)
stay in the model dtype under every scheme and run as fixed-shape products (`plain_mm`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from spinf.engine.attention import (
    BIDIRECTIONAL_NONE,
    AttentionPlan,
    apply_rope,
    decode_attention,
    tree_attention,
)
from spinf.engine.elementwise import pointwise
from spinf.engine.gemm import gpu_mm, row_stable_mm, stable_mm
from spinf.engine.gemma4.config import LayerSpec, TextConfig
from spinf.engine.gemma4.moe import MoeBlock
from spinf.engine.norm import rms_norm
from spinf.engine.quant import Fp8Weight, fp8_matmul, quantize
from spinf.engine.schemes import Scheme
from spinf.errors import ModelError


def kernels():
    """The Triton kernels, imported on first use (the CPU path never needs Triton)."""
    from spinf.engine import kernels as module

    return module


def rope_inv_freq(spec: LayerSpec) -> torch.Tensor:
    """Inverse frequencies; with "proportional" rope only the first ``fraction`` of the pairs rotate."""
    half = spec.head_dim // 2
    rotated = int(spec.rope_fraction * spec.head_dim // 2)
    exponents = torch.arange(0, 2 * rotated, 2, dtype=torch.int64).float() / spec.head_dim
    inv = 1.0 / (spec.rope_theta**exponents)
    return torch.cat([inv, torch.zeros(half - rotated)])


def plain_mm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x @ weight.T`` whose rows do not depend on the other rows, on either device: on a GPU in blocks of one
    fixed row count (`stable_mm`), since the row-count rule of `gpu_mm` was measured on the dense layers' shapes
    only, not on these narrow ones."""
    return stable_mm(x, weight)


LINEARS = ("wqkv", "wo", "w_gate_up", "w_down")  # a layer's (fused) linears, by module name


class DecoderLayer(nn.Module):
    def __init__(self, cfg: TextConfig, spec: LayerSpec, index: int = 0):
        super().__init__()
        self.spec = spec
        self.index = index
        self.prefix = f"layers.{index}."
        self.fp8: dict[str, tuple[Fp8Weight, float]] = {}  # linear name -> (fp8 weight, static input scale)
        self.scheme: Scheme | None = None  # a scheme that quantizes on the fly (spinf.engine.schemes), and its
        self.quantized: dict[str, object] = {}  # stored weights by linear name
        self.observer: Callable[[str, torch.Tensor], None] | None = None  # calibration: sees each linear's input
        self.eps = cfg.rms_norm_eps
        self.window = cfg.sliding_window if spec.is_sliding else None
        self.bidirectional = BIDIRECTIONAL_NONE  # how an image's placeholders attend (`Gemma4Text.image_attention`)
        q_out, kv_out = cfg.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
        self.qkv_sizes = (q_out, kv_out) if spec.k_eq_v else (q_out, kv_out, kv_out)
        if spec.kv_shared:  # a shared layer projects queries only
            self.qkv_sizes = (q_out,)
        inner = cfg.intermediate_size * (2 if spec.wide_mlp else 1)
        self.gate_up_sizes = (inner, inner)
        self.wqkv = nn.Linear(cfg.hidden_size, sum(self.qkv_sizes), bias=False)
        self.wo = nn.Linear(q_out, cfg.hidden_size, bias=False)
        self.w_gate_up = nn.Linear(cfg.hidden_size, 2 * inner, bias=False)
        self.w_down = nn.Linear(inner, cfg.hidden_size, bias=False)
        self.moe = MoeBlock(cfg) if spec.moe else None  # experts beside the MLP (the 26B A4B)
        for name in ("q_norm",) if spec.kv_shared else ("q_norm", "k_norm"):
            self.register_parameter(name, nn.Parameter(torch.ones(spec.head_dim)))
        norms = ["input_norm", "post_attn_norm", "pre_ff_norm", "post_ff_norm"]
        if cfg.per_layer_size:  # the gate of this layer's per-layer input and its projection back (E2B/E4B)
            self.per_layer_gate = nn.Linear(cfg.hidden_size, cfg.per_layer_size, bias=False)
            self.per_layer_proj = nn.Linear(cfg.per_layer_size, cfg.hidden_size, bias=False)
            norms.append("post_per_layer_norm")
        for name in norms:
            self.register_parameter(name, nn.Parameter(torch.ones(cfg.hidden_size)))
        self.register_buffer("layer_scalar", torch.ones(1))
        self._fused_consts: tuple[torch.Tensor, torch.Tensor] | None = None  # rope frequencies, q/k/v norm weights

    def forward(
        self,
        h: torch.Tensor,
        rope,
        plan: AttentionPlan,
        per_layer: torch.Tensor | None = None,
        shared: dict[bool, tuple[torch.Tensor, torch.Tensor]] | None = None,
    ) -> torch.Tensor:
        """The layer on a pass's hidden states [N, hidden]. ``per_layer`` [N, per_layer_size]: this layer's
        per-layer inputs (E2B/E4B); ``shared``: the pass's keys and values by layer kind (``is_sliding``), which
        each non-shared layer writes and each KV-shared layer reads."""
        if self.fused(h, plan):
            return self._forward_fused(h, plan, per_layer=per_layer, shared=shared)[0]
        n, d = h.shape[0], self.spec.head_dim
        x = rms_norm(h, self.input_norm, self.eps)
        parts = self.linear("wqkv", x).split(self.qkv_sizes, dim=-1)
        q = apply_rope(rms_norm(parts[0].view(n, -1, d), self.q_norm, self.eps), *rope)
        k = v = None
        if not self.spec.kv_shared:
            raw_k = parts[1].view(n, -1, d)
            k = apply_rope(rms_norm(raw_k, self.k_norm, self.eps), *rope)
            v = rms_norm(raw_k if self.spec.k_eq_v else parts[2].view(n, -1, d), None, self.eps)
        k, v = self._exchange_kv(k, v, shared)
        # a shared layer keeps (and in a decode step, stores) the rows it reads like any other layer, so captures
        # and decoder buffers stay one per layer
        k, v = self._kv_source(k, v, plan)
        if plan.kernel is not None:
            a = (
                kernels()
                .tree_attention_kernel(q, k, v, plan.kernel, self.window, bidirectional=self.bidirectional)
                .reshape(n, -1)
            )
        elif plan.decode is not None:
            a = decode_attention(q, k, v, plan, self.window).reshape(n, -1)
        else:
            a = tree_attention(q, k, v, plan, self.window, self.bidirectional).reshape(n, -1)
        h = h + rms_norm(self.linear("wo", a), self.post_attn_norm, self.eps)
        gate, up = self.linear("w_gate_up", rms_norm(h, self.pre_ff_norm, self.eps)).chunk(2, dim=-1)
        mlp = self.linear("w_down", F.gelu(gate, approximate="tanh") * up)
        if self.moe is not None:
            mlp = self.moe(h, mlp, self.prefix, self.observer)
        h = h + rms_norm(mlp, self.post_ff_norm, self.eps)
        if per_layer is not None:
            h = h + rms_norm(self.per_layer_projection(h, per_layer), self.post_per_layer_norm, self.eps)
        return h * self.layer_scalar.to(h.dtype)

    def per_layer_projection(self, h: torch.Tensor, per_layer: torch.Tensor, fused: bool = False) -> torch.Tensor:
        """What this layer's per-layer input adds to ``h`` before its norm (transformers' order: gate, GELU, times
        the input, projection back; the norm and the residual add follow), through row-stable products in the
        model dtype (never quantized); ``fused``: GELU·input through the `gelu_mul` kernel (the GPU path)."""
        gate = plain_mm(h, self.per_layer_gate.weight)
        if fused:
            gated = kernels().gelu_mul(torch.cat([gate, per_layer], dim=1))
        else:
            gated = pointwise(partial(F.gelu, approximate="tanh"), gate) * per_layer
        return plain_mm(gated, self.per_layer_proj.weight)

    def _exchange_kv(
        self, k: torch.Tensor | None, v: torch.Tensor | None, shared: dict | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys and values this layer attends with: a KV-shared layer's are those the last non-shared layer of
        its kind left in ``shared`` for the same rows of the pass; any other layer leaves its own there."""
        if self.spec.kv_shared:
            if shared is None or self.spec.is_sliding not in shared:
                raise ModelError(f"layer {self.prefix}: a KV-shared layer ran without the keys of an earlier layer")
            return shared[self.spec.is_sliding]
        if shared is not None:
            shared[self.spec.is_sliding] = (k, v)
        return k, v

    def _kv_source(self, k: torch.Tensor, v: torch.Tensor, plan: AttentionPlan) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys and values attention reads: the pass's own (kept for the decoder when the pass captures), or,
        in a decode step, the decoder's buffers with this step's written into them."""
        if plan.capture is not None:
            plan.capture.keep(k, v)
        if plan.decode is not None:
            return plan.decode.store(self.index, k, v)
        return k, v

    def fused(self, h: torch.Tensor, plan: AttentionPlan) -> bool:
        """Whether this pass takes the fused GPU path (bf16 activations, a kernel plan, no calibration observer)."""
        return plan.kernel is not None and h.dtype == torch.bfloat16 and self.observer is None

    def _forward_fused(
        self,
        h: torch.Tensor,
        plan: AttentionPlan,
        x: torch.Tensor | None = None,
        following: DecoderLayer | None = None,
        per_layer: torch.Tensor | None = None,
        shared: dict | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The same layer through the Triton kernels: each norm fused with the residual update before it and the
        fp8s quantizer after it, q/k/v prepared in one kernel, tree attention in one kernel that also quantizes
        its output, GELU·up fused with the down projection's quantizer.

        ``x`` is this layer's normed (and quantized) input when the layer before made it; with ``following``, the
        last kernel also makes that layer's input, returned second. ``per_layer`` and ``shared`` as in `forward`
        (a KV-shared layer's kernel prepares its queries only).
        """
        k_ = kernels()
        spec, eps, n = self.spec, self.eps, h.shape[0]
        if self._fused_consts is None:
            k_norm = self.q_norm if spec.kv_shared else self.k_norm  # a shared layer's kernel reads q's weights only
            self._fused_consts = (rope_inv_freq(spec).to(h.device), k_.qkv_norm_weights(self.q_norm, k_norm))
        inv_freq, qkv_norms = self._fused_consts
        if x is None:
            x = k_.norm_rows(h, self.input_norm, eps, self._input_scale("wqkv"))
        q, k, v = k_.prepare_qkv(
            self._gemm("wqkv", x),
            plan.kernel.positions,
            inv_freq,
            qkv_norms,
            heads=self.qkv_sizes[0] // spec.head_dim,
            kv_heads=0 if spec.kv_shared else spec.num_kv_heads,
            head_dim=spec.head_dim,
            k_eq_v=spec.k_eq_v,
            eps=eps,
        )
        k, v = self._kv_source(*self._exchange_kv(k, v, shared), plan)
        a = k_.tree_attention_kernel(
            q, k, v, plan.kernel, self.window, out_scale=self._input_scale("wo"), bidirectional=self.bidirectional
        )
        h, x = k_.add_norm(
            h,
            self._gemm("wo", a.view(n, -1)),
            self.post_attn_norm,
            eps,
            next_weight=self.pre_ff_norm,
            next_scale=self._input_scale("w_gate_up"),
        )
        down = self._gemm("w_down", self._glu(x))
        if self.moe is not None:
            down = self.moe.fused(h, down)
        post = self.post_ff_norm
        if per_layer is not None:  # the MLP's residual update, then the per-layer input's is the layer's last
            h = k_.add_norm(h, down, post, eps)
            down, post = self.per_layer_projection(h, per_layer, fused=True), self.post_per_layer_norm
        if following is None:
            return k_.add_norm(h, down, post, eps, self.layer_scalar), None
        return k_.add_norm(
            h,
            down,
            post,
            eps,
            self.layer_scalar,
            next_weight=following.input_norm,
            next_scale=following._input_scale("wqkv"),
        )

    def to_fp8s(self, scales: Mapping[str, float]) -> None:
        """This layer's linears to e4m3 with their static input scales (see `Gemma4Text.to_fp8s`)."""
        for name in LINEARS:
            module = getattr(self, name)
            weight = Fp8Weight.from_float(module.weight, self.part_sizes(name))
            self.fp8[name] = (weight, float(scales[self.prefix + name]))
            module.weight = nn.Parameter(module.weight.new_empty(0), requires_grad=False)
        if self.moe is not None:
            self.moe.to_fp8s(scales, self.prefix)

    def load_fp8(
        self, state: Mapping[str, torch.Tensor], fp8: Mapping[str, tuple[Fp8Weight, float]], scheme: Scheme | None
    ) -> None:
        """This layer from an fp8-static checkpoint: ``state`` without the linears, and the linears' fp8 weights
        with their input scales (`spinf.engine.gemma4.fp8_static.take_layer`), run as fp8s (the checkpoint's static
        input scales) or, with ``scheme`` (dynamic fp8), with the same weights and dynamic input scales."""
        norm = state["input_norm"]
        for name in LINEARS:
            getattr(self, name).weight = nn.Parameter(norm.new_empty(0), requires_grad=False)
        missing, unexpected = self.load_state_dict(state, assign=True, strict=False)
        if unexpected or set(missing) != {f"{name}.weight" for name in LINEARS}:
            raise ModelError(f"layer {self.prefix}: unexpected {unexpected}, missing {missing}")
        if scheme is None:
            self.fp8 = dict(fp8)
        else:
            self.quantized = {name: weight for name, (weight, _) in fp8.items()}
            self.scheme = scheme

    def to_scheme(self, scheme: Scheme) -> None:
        """This layer's linears stored as ``scheme`` stores them; the float weights are released."""
        for name in LINEARS:
            module = getattr(self, name)
            self.quantized[name] = scheme.quantize(module.weight, self.part_sizes(name))
            module.weight = nn.Parameter(module.weight.new_empty(0), requires_grad=False)
        self.scheme = scheme

    def stored_weights(self) -> list[object]:
        """The quantized weights the linears read (what a captured CUDA graph holds on to)."""
        experts = self.moe.stored_weights() if self.moe is not None else []
        return [weight for weight, _ in self.fp8.values()] + list(self.quantized.values()) + experts

    def part_sizes(self, name: str) -> tuple[int, ...] | None:
        """The output rows of each projection fused into linear ``name`` (q, k[, v]; gate, up), None if unfused:
        each part is quantized with its own scale, as a pre-quantized checkpoint stores it."""
        return {"wqkv": self.qkv_sizes, "w_gate_up": self.gate_up_sizes}.get(name)

    def _glu(self, x: torch.Tensor) -> torch.Tensor:
        """``gelu_tanh(gate) · up`` of the fused path, quantized for the down projection under fp8s: in one kernel
        (`spinf.engine.kernels.gemm`) where the GLU's weight is e4m3 and each tile's columns fit, else the gate/up
        product then the `gelu_mul` kernel."""
        k_ = kernels()
        down_scale = self._input_scale("w_down")
        if "w_gate_up" in self.fp8 and down_scale is not None:
            weight, scale = self.fp8["w_gate_up"]
            if weight.per_row and k_.gemm.glu_fits(weight.data):
                return k_.gemm.fp8_gemm(x, weight.data, weight.scaled_rows(scale), glu=True, out_scale=down_scale)
        return k_.gelu_mul(self._gemm("w_gate_up", x), down_scale)

    def _input_scale(self, name: str) -> float | None:
        return self.fp8[name][1] if name in self.fp8 else None

    def _gemm(self, name: str, x: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        """A linear on an input already prepared for it: e4m3 (quantized by its static scale) under fp8s, in the
        model dtype under a scheme that quantizes it itself, else in the input's dtype, row-stable on either
        device."""
        if name in self.fp8:
            weight, scale = self.fp8[name]
            return fp8_matmul(x, weight, scale, out_dtype=out_dtype)
        if self.scheme is not None:
            return self.scheme.linear(x, self.quantized[name], out_dtype)
        weight = getattr(self, name).weight
        return gpu_mm(x, weight) if x.is_cuda else row_stable_mm(x, weight)

    def linear(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """One of the layer's linears on a model-dtype input: the plain path (and calibration, which observes it)."""
        if self.observer is not None:
            self.observer(self.prefix + name, x)
        scale = self._input_scale(name)
        return self._gemm(name, x if scale is None else quantize(x, scale), out_dtype=x.dtype)
