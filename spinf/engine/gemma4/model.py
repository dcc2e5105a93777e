"""The Gemma 4 text decoder as the engine runs it: one flat pass of many jobs under tree attention.

Written as plain modules (gpt-fast style) and checked against transformers' definitions by the tests. Weights are
loaded from memory-mapped safetensors onto modules built on the ``meta`` device; q/k/v and gate/up are fused at
load so the forward stays a handful of GEMMs per layer. The forward returns hidden states; only the rows where an
option token is read go through the final norm and the LM head (`Gemma4Text.read_logprobs` on the CPU,
`Gemma4Text.option_logprobs` on a GPU). On a GPU with bf16 activations each layer runs `_forward_fused`, the same
arithmetic through the Triton kernels of `spinf.engine.kernels`.

The small models (E2B/E4B) add two things, on both paths: per-layer input embeddings (a second table looked up
by token, mixed with a projection of the pass's input embeddings, `Gemma4Text.per_layer_inputs`, and gated into
each layer's output, `DecoderLayer.per_layer_projection`) and KV-shared layers, which compute no keys and values
and attend with those the last non-shared layer of their kind made for the same rows of the pass (`DecoderLayer.
_exchange_kv`). Their small linears (the per-layer gate, projection and table projection) stay in the model dtype
under every scheme and run as fixed-shape products (`_plain_mm`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from spinf.engine.attention import (
    BIDIRECTIONAL_IN_WINDOW,
    BIDIRECTIONAL_NONE,
    BIDIRECTIONAL_OR,
    AttentionPlan,
    apply_rope,
    decode_attention,
    tree_attention,
)
from spinf.engine.extraction.budget import CaptureCost
from spinf.engine.gemm import gpu_mm, row_stable_mm, stable_mm
from spinf.engine.gemma4.config import LayerSpec, TextConfig
from spinf.engine.gemma4.moe import MoeBlock
from spinf.engine.graphs import PassGraphs
from spinf.engine.head import DEFAULT_HEAD, HEAD_ROWS, head_logits, head_precision, head_rows, head_weight
from spinf.engine.norm import rms_norm
from spinf.engine.quant import Fp8Weight, fp8_matmul, quantize
from spinf.engine.scales import ScaleTableMismatch
from spinf.engine.schemes import SCHEMES, Scheme
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


def _plain_mm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
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
        gate = _plain_mm(h, self.per_layer_gate.weight)
        if fused:
            gated = kernels().gelu_mul(torch.cat([gate, per_layer], dim=1))
        else:
            gated = F.gelu(gate, approximate="tanh") * per_layer
        return _plain_mm(gated, self.per_layer_proj.weight)

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
        down = self._gemm("w_down", k_.gelu_mul(self._gemm("w_gate_up", x), self._input_scale("w_down")))
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


class Gemma4Text(nn.Module):
    """The decoder stack with a tied LM head; `forward` gives hidden states of a packed pass."""

    def __init__(self, cfg: TextConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, spec, i) for i, spec in enumerate(cfg.layers))
        self.final_norm = nn.Parameter(torch.ones(cfg.hidden_size))
        if cfg.per_layer_size:  # E2B/E4B: a [vocab, layers * size] table and a projection of the input embeddings
            width = len(cfg.layers) * cfg.per_layer_size
            self.embed_per_layer = nn.Embedding(cfg.per_layer_vocab, width)
            self.per_layer_model_proj = nn.Linear(cfg.hidden_size, width, bias=False)
            self.per_layer_proj_norm = nn.Parameter(torch.ones(cfg.per_layer_size))
        kinds = {spec.is_sliding: spec for spec in cfg.layers}
        self._rope_specs = kinds
        self.head_mode = DEFAULT_HEAD  # the LM head's precision (spinf.engine.head)

    def forward(self, token_ids: torch.Tensor, plan: AttentionPlan) -> torch.Tensor:
        """Hidden states [num_tokens, hidden] (before the final norm) of one pass."""
        h = self.embed(token_ids)
        # Gemma scales embeddings by sqrt(hidden) rounded to the model dtype, as transformers does
        h = h * torch.tensor(self.cfg.hidden_size**0.5, dtype=h.dtype)
        if plan.media is not None:  # media placeholders take their embeddings, unscaled (A.14.1)
            rows, embedded = plan.media
            h = h.index_copy(0, rows, embedded.to(h.dtype))
        fused = plan.kernel is not None and self.runs_fused()
        per_layer = self.per_layer_inputs(token_ids, h, plan, fused) if self.cfg.per_layer_size else None
        shared: dict[bool, tuple[torch.Tensor, torch.Tensor]] = {}
        if fused:  # each layer hands the next its normed input
            x = None
            for i, layer in enumerate(self.layers):
                following = self.layers[i + 1] if i + 1 < len(self.layers) else None
                mine = None if per_layer is None else per_layer[:, i]
                h, x = layer._forward_fused(h, plan, x, following, mine, shared)
            return h
        ropes = {kind: self._rope(spec, plan.positions, h.dtype) for kind, spec in self._rope_specs.items()}
        for i, layer in enumerate(self.layers):
            h = layer(h, ropes[layer.spec.is_sliding], plan, None if per_layer is None else per_layer[:, i], shared)
        return h

    def per_layer_inputs(
        self, token_ids: torch.Tensor, h: torch.Tensor, plan: AttentionPlan, fused: bool = False
    ) -> torch.Tensor:
        """Every layer's per-layer inputs [N, layers, size] (E2B/E4B), as transformers computes them: the token's
        row of the per-layer table scaled by sqrt(size) (a media placeholder looks up the pad token's row), plus
        the input embeddings ``h`` projected, scaled by 1/sqrt(hidden) and normed per layer, times 1/sqrt(2).
        ``fused`` (the GPU path): the norm is the row-wise `norm_rows` kernel, whose rows never depend on the
        others (torch's GPU reductions split a row by the number of rows)."""
        cfg, n, size = self.cfg, token_ids.shape[0], self.cfg.per_layer_size
        if plan.media is not None:
            token_ids = token_ids.index_fill(0, plan.media[0], cfg.pad_token_id)
        table = self.embed_per_layer(token_ids) * torch.tensor(size**0.5, dtype=h.dtype)
        projected = _plain_mm(h, self.per_layer_model_proj.weight) * cfg.hidden_size**-0.5
        if fused:
            normed = kernels().norm_rows(projected.reshape(-1, size), self.per_layer_proj_norm, cfg.rms_norm_eps)
        else:
            normed = rms_norm(projected.view(n, -1, size), self.per_layer_proj_norm, cfg.rms_norm_eps)
        return (normed.view(n, -1, size) + table.view(n, -1, size)) * 2.0**-0.5

    def image_attention(self, mode: int) -> None:
        """How an image's placeholders attend to each other (engine spec A.14.6, `MediaConfig.bidirectional`): on every
        layer beyond the window too (`BIDIRECTIONAL_OR`, the unified 12B), on sliding layers within the window
        (`BIDIRECTIONAL_IN_WINDOW`, the 31B), or causally."""
        for layer in self.layers:
            on = mode == BIDIRECTIONAL_OR or (mode == BIDIRECTIONAL_IN_WINDOW and layer.spec.is_sliding)
            layer.bidirectional = mode if on else BIDIRECTIONAL_NONE

    def tile_rows(self) -> set[int]:
        """The tree-attention kernel's query rows per program, one per layer kind (the scorer's GPU pass plans hold
        these tables)."""
        from spinf.engine.kernels import tile_rows

        heads = self.cfg.num_heads
        return {tile_rows(layer.spec.head_dim, heads // layer.spec.num_kv_heads) for layer in self.layers}

    def kv_bytes_per_token(self) -> int:
        """The bytes one token's keys and values take over all layers, in the activation dtype (the decoder's)."""
        size = self.embed.weight.element_size()
        return sum(2 * layer.spec.num_kv_heads * layer.spec.head_dim * size for layer in self.layers)

    def pass_plan(self, layout, plan: AttentionPlan) -> AttentionPlan:
        """The plan the forward takes for ``layout``: the scorer's tree-attention plan, as it is."""
        return plan

    def capture_cost(self) -> CaptureCost:
        """What the decoder holds: every row's keys and values alike, nothing per prefix."""
        per_token = self.kv_bytes_per_token()
        return CaptureCost(per_token, per_token)

    def pass_graphs(self, device: torch.device, tile_rows: set[int]) -> PassGraphs:
        """The CUDA graphs of this model's small fused passes (`spinf.engine.graphs`)."""
        return PassGraphs(self, device, tile_rows)

    def weights_key(self) -> tuple:
        """What identifies the weights a graph reads: the tensors' addresses and types (the first and last layers'
        stored weights stand for all: a scheme applied after loading replaces every layer's)."""
        layers = (self.layers[0], self.layers[-1])
        fp8 = tuple(id(weight) for layer in layers for weight in layer.stored_weights())
        return (self.embed.weight.data_ptr(), self.embed.weight.dtype, fp8, layers[-1].input_norm.data_ptr())

    def runs_fused(self) -> bool:
        """Whether a pass with a kernel plan takes the fused GPU path: bf16 activations, no calibration observer
        (what `DecoderLayer.fused` asks of each layer)."""
        return self.embed.weight.dtype == torch.bfloat16 and all(layer.observer is None for layer in self.layers)

    def _rope(self, spec: LayerSpec, positions: torch.Tensor, dtype: torch.dtype):
        inv = rope_inv_freq(spec).to(positions.device)
        freqs = positions[:, None].float() * inv[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def linear_names(self) -> list[str]:
        return [layer.prefix + name for layer in self.layers for name in LINEARS]

    @contextlib.contextmanager
    def observing(self, observer: Callable[[str, torch.Tensor], None]):
        """Within the block, every linear's input is shown to ``observer`` (calibration of fp8s scales)."""
        for layer in self.layers:
            layer.observer = observer
        try:
            yield
        finally:
            for layer in self.layers:
                layer.observer = None

    def to_fp8s(self, scales: Mapping[str, float]) -> None:
        """Quantize every decoder linear to e4m3 with the static input ``scales`` (engine spec B.8, fp8s).

        The float weights are released; the embedding, norms and head stay in the model dtype.
        """
        self.check_scales(scales)
        for layer in self.layers:
            layer.to_fp8s(scales)

    def to_scheme(self, name: str) -> None:
        """Quantize every decoder linear with the on-the-fly scheme ``name`` (fp8, fp8row, w8a16, w8a8)."""
        for layer in self.layers:
            layer.to_scheme(SCHEMES[name])

    def head_precision(self) -> str:
        return head_precision(self.head_mode, self.embed.weight.dtype)

    def check_scales(self, scales: Mapping[str, float]) -> None:
        missing = [name for name in self.linear_names() if name not in scales]
        if missing:
            raise ScaleTableMismatch(f"the scale table has no scale for {len(missing)} linears, e.g. {missing[0]}")

    def option_logprobs(
        self, hidden_rows: torch.Tensor, pick_rows: torch.Tensor, pick_cols: torch.Tensor, bounds: list[int]
    ) -> torch.Tensor:
        """fp32 log-probs of token ``pick_cols[i]`` at read row ``pick_rows[i]``, without a full log-softmax.

        The GPU head: read rows go through in chunks of exactly ``HEAD_ROWS`` rows (the last padded), so every
        product and reduction has one shape; per chunk the head gives fp32 logits (in the precision of ``head_mode``,
        `spinf.engine.head`), soft-capped, and the full-vocabulary log-sum-exp; only the picked columns leave.
        ``pick_rows`` is sorted, and the picks of chunk ``c`` are ``bounds[c]:bounds[c + 1]``. The soft-capped
        log-sum-exp is one Triton kernel, so no fp32 tensor larger than the one ``[HEAD_ROWS, vocab]`` logits chunk
        exists (beside, under fp32, the embedding cast once per pass)."""
        out = []
        cap, mode = self.cfg.final_logit_softcapping, self.head_mode
        weight = head_weight(self.embed.weight, mode) if hidden_rows.shape[0] else None
        for c, start in enumerate(range(0, hidden_rows.shape[0], HEAD_ROWS)):
            chunk = head_rows(hidden_rows[start : start + HEAD_ROWS], mode)
            if chunk.shape[0] < HEAD_ROWS:
                chunk = torch.cat([chunk, chunk.new_zeros((HEAD_ROWS - chunk.shape[0], chunk.shape[1]))])
            logits = head_logits(rms_norm(chunk, self.final_norm, self.cfg.rms_norm_eps), weight, mode)
            lse = kernels().softcap_logsumexp(logits, cap)
            rows = pick_rows[bounds[c] : bounds[c + 1]] - start
            picked = logits[rows, pick_cols[bounds[c] : bounds[c + 1]]]
            if cap is not None:
                picked = torch.tanh(picked / cap) * cap
            out.append(picked - lse[rows])
        return torch.cat(out) if out else hidden_rows.new_zeros(0, dtype=torch.float32)

    def full_logprobs(self, hidden_rows: torch.Tensor) -> torch.Tensor:
        """Full-vocabulary fp32 log-softmax [rows, vocab] at the given (pre-norm) hidden rows: what the decoder
        searches and samples on. On a GPU the rows go through in chunks of exactly ``HEAD_ROWS`` (the last padded),
        with the soft-capped log-sum-exp of the Triton kernel, so a row's numbers never depend on the other rows."""
        if not hidden_rows.is_cuda:
            return self.read_logprobs(hidden_rows)
        cap, mode = self.cfg.final_logit_softcapping, self.head_mode
        weight = head_weight(self.embed.weight, mode)
        out = []
        for start in range(0, hidden_rows.shape[0], HEAD_ROWS):
            chunk = head_rows(hidden_rows[start : start + HEAD_ROWS], mode)
            size = chunk.shape[0]
            if size < HEAD_ROWS:
                chunk = torch.cat([chunk, chunk.new_zeros((HEAD_ROWS - size, chunk.shape[1]))])
            logits = head_logits(rms_norm(chunk, self.final_norm, self.cfg.rms_norm_eps), weight, mode)
            lse = kernels().softcap_logsumexp(logits, cap)
            if cap is not None:
                logits = torch.tanh(logits / cap) * cap
            out.append((logits - lse[:, None])[:size])
        if not out:
            return hidden_rows.new_zeros((0, self.embed.weight.shape[0]), dtype=torch.float32)
        return torch.cat(out)

    def read_logprobs(self, hidden_rows: torch.Tensor) -> torch.Tensor:
        """Full-vocabulary fp32 log-softmax [rows, vocab] at the given (pre-norm) hidden rows, after soft-capping
        (the CPU head; ``head_mode`` rounds its operands and logits as on a GPU)."""
        mode = self.head_mode
        x = rms_norm(head_rows(hidden_rows, mode), self.final_norm, self.cfg.rms_norm_eps)
        logits = head_logits(x, head_weight(self.embed.weight, mode), mode)
        cap = self.cfg.final_logit_softcapping
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return torch.log_softmax(logits, dim=-1)
