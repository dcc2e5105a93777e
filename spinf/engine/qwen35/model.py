"""The Qwen3.5 text decoder over one packed pass of jobs with tries, in plain torch (CPU, fp32; engine spec B.14).

Every layer is a token mixer and a SiLU MLP, each behind an RMSNorm that multiplies by ``(1 + w)``. The mixer is a
**full-attention layer** (every 4th in the published models) or a **Gated DeltaNet** (`spinf.engine.qwen35.gdn`):

* Full attention: q (with a per-head output gate beside it in ``q_proj``), k, v; q/k RMSNorm per head; rope on the
  first ``rotary_dim`` dims of each head, each pair turning with the t, h or w position as its 3-D section says
  (`rope_axes`; text has t = h = w, so the sections reduce to plain rope); tree
  attention over the pass (`spinf.engine.attention.tree_attention`), then ``· sigmoid(gate)``.
* GDN: the gated delta rule along the segments of the pass's plan (`spinf.engine.qwen35.plan`).

The products run in fixed 128-row blocks (`row_stable_mm`) and elementwise transcendental functions on widths padded
to whole vector blocks (`spinf.engine.elementwise.pointwise`). On a GPU the recurrence runs in the Triton kernel by
segment index (`spinf.engine.kernels.gdn`, token by token in every segment) and the full-attention layers in the
Gemma stack's tree-attention kernel. Linears are made by a factory (`MakeLinear`): float (`Dense`) or int4
(`spinf.engine.qwen35.int4`). The LM head runs in ``head_mode`` (`spinf.engine.head`, engine spec B.7: the final
norm in fp32 always, then the product's operands and logits as the mode rounds them); the decider's readout replaces
it. ``layers`` keeps the first that many decoder layers. A decode step (extraction) replays each row's recurrence
from its prefix's state (on a GPU in the kernel's decode step, from the state the scoring pass's kernel wrote at the
prefix's end); of a prefix a recurrent layer captures only that state and its last ``kernel - 1`` rows
(`CaptureCost`). Not yet here: a chunked kernel for long segments.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from pathlib import Path

import attrs
import torch
import torch.nn.functional as F
from torch import nn

from spinf.engine.attention import AttentionPlan, decode_attention, tree_attention
from spinf.engine.elementwise import pointwise
from spinf.engine.folder import read_tensors
from spinf.engine.head import DEFAULT_HEAD, HEAD_ROWS, check_mode, head_logits, head_precision, head_weight
from spinf.engine.layout import PassLayout
from spinf.engine.qwen35.config import FULL, Qwen35Config, read_qwen35_config
from spinf.engine.qwen35.gdn import GatedDeltaNet
from spinf.engine.qwen35.ops import MakeLinear, float_linears, linear_plus, made_plus, norm_linear, rms_norm
from spinf.engine.qwen35.plan import Qwen35Plan, kernel_config, pass_plan
from spinf.errors import ModelError

# A pass's MLPs run in row chunks of this many: their [rows, 2 · inner] intermediate is the pass's largest tensor
# (1.1 GB at the 27B for 16,384 rows), and every row of them is its own (row-wise norms and quantizers, products in
# fixed row blocks that divide this, or whose tile changes no bit), so a chunk changes no bit, only the peak memory.
MLP_ROWS = 4096


def rope_axes(cfg: Qwen35Config) -> torch.Tensor:
    """Which of (t, h, w) each rotary pair turns with, as transformers' Qwen3.5 interleaves them: pair ``j`` is h
    when ``j % 3 == 1`` and ``j < 3 · sections[1]``, w when ``j % 3 == 2`` and ``j < 3 · sections[2]``, else t."""
    pairs = torch.arange(cfg.rotary_dim // 2)
    _, h, w = cfg.mrope_section
    axes = torch.zeros_like(pairs)
    axes[(pairs % 3 == 1) & (pairs < 3 * h)] = 1
    axes[(pairs % 3 == 2) & (pairs < 3 * w)] = 2
    return axes


def rope_inv_freq(cfg: Qwen35Config) -> torch.Tensor:
    """The rotary pairs' inverse frequencies (the exponent runs over the rotary dims only)."""
    exponents = torch.arange(0, cfg.rotary_dim, 2, dtype=torch.int64).float() / cfg.rotary_dim
    return 1.0 / (cfg.rope_theta**exponents)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half rope on the first ``cos.shape[-1]`` dims of each head. x [N, heads, d]; cos, sin [N, rotary]."""
    rot = cos.shape[-1]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)  # bf16 stays bf16 (fp32 angles would promote the whole residual)
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    half = rot // 2
    turned = torch.cat((-x_rot[..., half:], x_rot[..., :half]), dim=-1)
    return torch.cat((x_rot * cos[:, None] + turned * sin[:, None], x_pass), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: Qwen35Config, take: Callable[[str], torch.Tensor], linear: MakeLinear, prefix: str):
        super().__init__()
        self.cfg = cfg
        q_out, kv_out = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.sizes = (2 * q_out, kv_out, kv_out)  # q with its gate (per head: query, then gate), k, v
        self.wqkv = linear([prefix + "q_proj", prefix + "k_proj", prefix + "v_proj"])
        self.q_norm = nn.Parameter(take(prefix + "q_norm.weight"), requires_grad=False)
        self.k_norm = nn.Parameter(take(prefix + "k_norm.weight"), requires_grad=False)
        self.wo = linear([prefix + "o_proj"])

    def forward(
        self, h: torch.Tensor, norm: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], plan: Qwen35Plan
    ) -> torch.Tensor:
        """``h`` plus attention over its rows normed by the input norm ``norm`` (`norm_linear`, `linear_plus`)."""
        cfg, n, d = self.cfg, h.shape[0], self.cfg.head_dim
        scale = d**-0.5
        qkv, _ = norm_linear(self.wqkv, h, norm, cfg.rms_norm_eps)
        qg, k, v = qkv.split(self.sizes, dim=-1)
        q, gate = qg.reshape(n, cfg.num_heads, 2 * d).split(d, dim=-1)
        rows_kernels = qkv.is_cuda and qkv.dtype in (torch.bfloat16, torch.float32)
        if rows_kernels:  # one row-wise kernel each for q and k, read in place (`qwen_rows.qk_rope`)
            from spinf.engine.kernels.qwen_rows import qk_rope

            eps, heads, kv_heads = cfg.rms_norm_eps, cfg.num_heads, cfg.num_kv_heads
            q_scaled = qk_rope(qkv, heads, 2 * d, d, self.q_norm, *rope, eps, scale)
            k = qk_rope(qkv[:, self.sizes[0] :], kv_heads, d, d, self.k_norm, *rope, eps)
        else:
            q = apply_rope(rms_norm(q, self.q_norm, cfg.rms_norm_eps), *rope)
            k = apply_rope(rms_norm(k.reshape(n, -1, d), self.k_norm, cfg.rms_norm_eps), *rope)
            q_scaled = q * scale
        if plan.attention.capture is not None:  # what the decoder attends to: these rows' keys and values
            plan.attention.capture.keep(k, v.reshape(n, -1, d))
            plan.attention.capture.states.append(None)
        keys, values = k, v.reshape(n, -1, d)
        if plan.attention.decode is not None:  # a decode step: this step's keys and values into the buffers
            keys, values = plan.attention.decode.store(self.index, keys, values)
        if plan.attention.kernel is not None:  # a pass, or a decode step over the buffers (the scorer's plan)
            from spinf.engine.kernels import tree_attention_kernel

            config = kernel_config(d, cfg.num_heads // cfg.num_kv_heads)
            a = tree_attention_kernel(q_scaled, keys, values, plan.attention.kernel, None, config)
        elif plan.attention.decode is not None:
            a = decode_attention(q_scaled, keys, values, plan.attention, None)
        else:
            a = tree_attention(q_scaled, k, v.reshape(n, -1, d), plan.attention, None)
        if rows_kernels and a.dtype == qkv.dtype:
            from spinf.engine.kernels.qwen_rows import sigmoid_mul

            return made_plus(self.wo, functools.partial(sigmoid_mul, a.reshape(n, -1, d), qkv[:, d:], d, 2 * d), a, h)
        return linear_plus(self.wo, a.reshape(n, -1) * pointwise(torch.sigmoid, gate.reshape(n, -1)), h)


class DecoderLayer(nn.Module):
    def __init__(
        self,
        cfg: Qwen35Config,
        kind: str,
        take: Callable[[str], torch.Tensor],
        linear: MakeLinear,
        at: str,
        index: int = 0,
    ):
        super().__init__()
        self.is_attention = kind == FULL
        if self.is_attention:
            self.mixer = Attention(cfg, take, linear, at + "self_attn.")
        else:
            self.mixer = GatedDeltaNet(cfg, take, linear, at + "linear_attn.")
        self.mixer.index = index  # its buffers in a decode step (`DecodeKV`)
        self.eps = cfg.rms_norm_eps
        self.input_norm = nn.Parameter(take(at + "input_layernorm.weight"), requires_grad=False)
        self.post_norm = nn.Parameter(take(at + "post_attention_layernorm.weight"), requires_grad=False)
        self.w_gate_up = linear([at + "mlp.gate_proj", at + "mlp.up_proj"])
        self.w_down = linear([at + "mlp.down_proj"])

    def forward(self, h: torch.Tensor, rope, plan: Qwen35Plan, out: torch.Tensor | None = None) -> torch.Tensor:
        """The layer's output rows, into ``out`` when given (a tensor shaped as ``h`` that ``h`` does not share)."""
        if self.is_attention:
            return self.mlp_residual(self.mixer(h, self.input_norm, rope, plan), out)
        return self.mlp_residual(self.mixer(h, self.input_norm, plan), out)

    def mixer_inputs(
        self, h: torch.Tensor, plan: Qwen35Plan, empty=None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """A GDN layer's part before its recurrence (`forward` in three parts, for the CUDA graphs of
        `spinf.engine.qwen35.graphs`): z and the recurrence's inputs (q, k, v, g, beta, decay), these into
        ``empty``'s tensors on a GPU when given (`GatedDeltaNet.recurrence_inputs`)."""
        _, z, inputs = self.mixer.inputs(h, self.input_norm, plan, empty)
        return z, inputs

    def mixer_finish(
        self, h: torch.Tensor, o: torch.Tensor, z: torch.Tensor, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """A GDN layer's part after its recurrence's outputs ``o``: the gated norm, out_proj, the residual, the MLP;
        into ``out`` when given (which may be ``h``'s own buffer: ``h`` is read before the MLP writes)."""
        return self.mlp_residual(self.mixer.output(o, z, h), out)

    def mlp_residual(self, h: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """``h`` plus the MLP of its normed rows, over at most `MLP_ROWS` rows at a time (each part written into
        its rows of one output, ``out`` when given: no concatenation)."""
        if h.shape[0] <= MLP_ROWS:
            return self._mlp(h, out)
        if out is None:
            out = torch.empty_like(h)
        for start in range(0, h.shape[0], MLP_ROWS):
            rows = slice(start, start + MLP_ROWS)
            self._mlp(h[rows], out[rows])
        return out

    def _mlp(self, residual: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """``residual + mlp(post_norm(residual))``, into ``out`` when given (the norm inside the gate/up product's
        quantizer and the residual inside the down product where they can: `norm_linear`, `linear_plus`)."""
        gate_up, _ = norm_linear(self.w_gate_up, residual, self.post_norm, self.eps)
        if gate_up.is_cuda:  # one row-wise kernel (spinf.engine.kernels.qwen_rows)
            from spinf.engine.kernels.qwen_rows import silu_mul

            return made_plus(self.w_down, functools.partial(silu_mul, gate_up), gate_up, residual, out)
        gate, up = gate_up.chunk(2, dim=-1)
        return linear_plus(self.w_down, pointwise(F.silu, gate) * up, residual, out)


class Qwen35Text(nn.Module):
    """The decoder stack with an untied LM head; `forward` gives hidden states of a packed pass. Built from the
    checkpoint's tensors (``take``: a full name to its tensor) with each linear made by ``linear``."""

    def __init__(
        self,
        cfg: Qwen35Config,
        take: Callable[[str], torch.Tensor],
        linear: MakeLinear,
        prefix: str,
        head: torch.Tensor | None,
        readout=None,
    ):
        super().__init__()
        self.cfg = cfg
        # the decider's readout (`spinf.engine.qwen35.readout.Readout`, A.15) replaces the LM head when given
        self.readout = readout
        self.embed = nn.Parameter(take(prefix + "embed_tokens.weight"), requires_grad=False)
        self.layers = nn.ModuleList(
            DecoderLayer(cfg, kind, take, linear, f"{prefix}layers.{i}.", i) for i, kind in enumerate(cfg.layer_types)
        )
        self.final_norm = nn.Parameter(take(prefix + "norm.weight"), requires_grad=False)
        self.lm_head = None if head is None else nn.Parameter(head, requires_grad=False)
        self.head_mode = DEFAULT_HEAD  # the LM head's precision (spinf.engine.head)
        self.register_buffer("inv_freq", rope_inv_freq(cfg), persistent=False)

    def plan(self, layout: PassLayout) -> Qwen35Plan:
        """The plan of a pass on the model's device (on a GPU with the tree-attention kernel's tables)."""
        device = self.embed.device
        shape = self.attention_shape() if device.type == "cuda" else None
        return pass_plan(layout, self.cfg.linear_conv_kernel_dim, device, shape)

    def forward(self, token_ids: torch.Tensor, plan: Qwen35Plan | AttentionPlan) -> torch.Tensor:
        """Hidden states [num_tokens, hidden] (before the final norm) of one pass, or of a decode step's rows (the
        decoder's plan: an `AttentionPlan` with its ``decode``)."""
        if isinstance(plan, AttentionPlan):
            plan = Qwen35Plan(attention=plan, taps=None, segments=(), kept=frozenset())
        h = F.embedding(token_ids, self.embed)
        if plan.attention.media is not None:  # the placeholders' rows become the tower's embeddings (A.14.1)
            rows, embedded = plan.attention.media
            h = h.index_copy(0, rows, embedded.to(h.dtype))
        rope = self.rope(plan)
        for layer in self.layers:
            h = layer(h, rope, plan)
        return h

    def rope(self, plan: Qwen35Plan) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows' rotary cos and sin [N, rotary dims] from the plan's positions."""
        if plan.positions3 is None:
            freqs = plan.attention.positions[:, None].float() * self.inv_freq[None, :]
        else:  # each pair turns with its own axis's position (`rope_axes`)
            axes = rope_axes(self.cfg).to(plan.positions3.device)
            freqs = plan.positions3[:, axes].float() * self.inv_freq[None, :]
        angles = torch.cat((freqs, freqs), dim=-1)
        return pointwise(torch.cos, angles), pointwise(torch.sin, angles)

    def head_weight(self) -> torch.Tensor | None:
        """The LM head as ``head_mode``'s product reads it (None under the readout): made once per pass, since the
        fp32 mode's copy of the 27B's head is 5 GB."""
        return None if self.readout is not None else head_weight(self.lm_head, self.head_mode)

    def read_logprobs(self, hidden_rows: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        """Full-vocabulary fp32 log-softmax [rows, vocab] at the given (pre-norm) hidden rows: the LM head's in
        ``head_mode`` (``weight``: `head_weight`, made here when not given), or the decider's readout (−inf off its
        codes). The final norm runs in fp32; f32out and bf16 read its rows in the head's dtype (bf16 on a GPU: no
        fp32 copy of the 2.5 GB head per chunk), fp32 reads them as they are."""
        x = rms_norm(hidden_rows.float(), self.final_norm, self.cfg.rms_norm_eps)
        if self.readout is not None:
            return self.readout.logprobs(x)
        weight = self.head_weight() if weight is None else weight
        if self.head_mode != "fp32":
            x = x.to(self.lm_head.dtype)
        return torch.log_softmax(head_logits(x, weight, self.head_mode), dim=-1)

    def full_logprobs(self, hidden_rows: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        """`read_logprobs` in chunks of exactly ``HEAD_ROWS`` rows (the last padded), so that on a GPU every product
        has one shape and a row's numbers never depend on the other rows."""
        weight = self.head_weight() if weight is None else weight
        out = []
        for start in range(0, hidden_rows.shape[0], HEAD_ROWS):
            chunk = hidden_rows[start : start + HEAD_ROWS]
            size = chunk.shape[0]
            if size < HEAD_ROWS and hidden_rows.is_cuda:
                chunk = torch.cat([chunk, chunk.new_zeros((HEAD_ROWS - size, chunk.shape[1]))])
            out.append(self.read_logprobs(chunk, weight)[:size])
        if not out:
            return hidden_rows.new_zeros((0, self.cfg.vocab_size), dtype=torch.float32)
        return torch.cat(out)

    def option_logprobs(
        self, hidden_rows: torch.Tensor, pick_rows: torch.Tensor, pick_cols: torch.Tensor, bounds: list[int]
    ) -> torch.Tensor:
        """fp32 log-probs of token ``pick_cols[i]`` at read row ``pick_rows[i]`` (the scorer's GPU call): the read
        rows in chunks of exactly ``HEAD_ROWS`` (the last padded), the picks of chunk ``c`` being
        ``bounds[c]:bounds[c + 1]``, so that no [read rows, vocab] tensor is held beyond one chunk's."""
        out = []
        weight = self.head_weight() if hidden_rows.shape[0] else None
        for c, start in enumerate(range(0, hidden_rows.shape[0], HEAD_ROWS)):
            logprobs = self.full_logprobs(hidden_rows[start : start + HEAD_ROWS], weight)
            rows = pick_rows[bounds[c] : bounds[c + 1]] - start
            out.append(logprobs[rows, pick_cols[bounds[c] : bounds[c + 1]]])
        return torch.cat(out) if out else hidden_rows.new_zeros(0, dtype=torch.float32)

    def head_precision(self) -> str:
        """The head's part of the fingerprint (api spec §11): the readout (fp32), or the LM head in its mode
        (`spinf.engine.head.head_precision`: f32out on an fp32 model is fp32)."""
        if self.readout is not None:
            return "readout fp32"
        return f"lm_head {head_precision(self.head_mode, self.lm_head.dtype)}"

    def runs_fused(self) -> bool:
        """Whether a pass with a kernel plan runs the GPU path a CUDA graph holds: on a GPU, always (the stack has
        no calibration observer)."""
        return self.embed.is_cuda

    def pass_graphs(self, device: torch.device, tile_rows: set[int]):
        """The CUDA graphs of this stack's scoring passes (`spinf.engine.qwen35.graphs`: every layer's row-wise
        part replayed, the recurrences between them eager)."""
        from spinf.engine.qwen35.graphs import QwenPassGraphs

        return QwenPassGraphs(self, device, tile_rows)

    def weights_key(self) -> tuple:
        """What identifies the weights a graph reads: the embedding's storage, and whether each of the first and
        last layers' linears reads int8 weights kept unpacked (`spinf.engine.qwen35.int4.keep_unpacked`)."""
        kept = tuple(
            id(getattr(module, "int8", None))
            for layer in (self.layers[0], self.layers[-1])
            for module in layer.modules()
        )
        return (self.embed.data_ptr(), self.embed.dtype, kept)

    def capture_cost(self):
        """What the decoder holds (`spinf.engine.extraction.budget.CaptureCost`): a prefix row only in the attention
        layers; per prefix, each recurrent layer's fp32 state and its last ``kernel - 1`` rows (the convolution's
        reach); a path row in every layer."""
        from spinf.engine.extraction.budget import CaptureCost

        cfg, size = self.cfg, self.embed.element_size()
        heads, dk, dv = cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim
        attention = 2 * cfg.num_kv_heads * cfg.head_dim * size
        recurrent = (cfg.conv_dim + heads * (dk + dv) + 2 * heads) * 4  # fp32 at most (the rows' dtypes)
        kinds = [layer.is_attention for layer in self.layers]
        tail = cfg.linear_conv_kernel_dim - 1
        per_prefix = kinds.count(False) * (heads * dk * dv * 4 + tail * recurrent)
        return CaptureCost(
            prefix_token=max(1, kinds.count(True) * attention),
            path_token=kinds.count(True) * attention + kinds.count(False) * recurrent,
            per_prefix=per_prefix,
            tail=tail,
        )

    def attention_shape(self) -> tuple[int, int]:
        """The full-attention layers' (head dim, query heads per KV head)."""
        return self.cfg.head_dim, self.cfg.num_heads // self.cfg.num_kv_heads

    def tile_rows(self) -> set[int]:
        """The tree-attention kernel's query rows per program (the scorer's GPU pass plans hold these tables)."""
        from spinf.engine.kernels.attention import tile_rows

        return {tile_rows(*self.attention_shape(), kernel_config(*self.attention_shape()))}

    def pass_plan(self, layout: PassLayout, attention: AttentionPlan, taps: torch.Tensor | None = None) -> Qwen35Plan:
        """The plan of one pass around the scorer's tree-attention plan ``attention`` (its kernel tables, capture and
        media): the recurrent segments and the convolution's taps, on the model's device (in ``taps``, a CUDA
        graph's buffer, when given)."""
        kernel = self.cfg.linear_conv_kernel_dim
        return pass_plan(layout, kernel, self.embed.device, attention=attention, taps_buffer=taps)

    def pass_logprobs(self, layout: PassLayout) -> torch.Tensor:
        """The pass's full-vocabulary log-probs at its read rows, [len(layout.read_rows), vocab]."""
        device = self.embed.device
        hidden = self(torch.tensor(layout.token_ids, dtype=torch.long, device=device), self.plan(layout))
        return self.read_logprobs(hidden[torch.tensor(layout.read_rows, dtype=torch.long, device=device)])


def load_qwen35(
    folder: str | Path,
    dtype: torch.dtype = torch.float32,
    linear: MakeLinear | None = None,
    readout=None,
    raw: Mapping[str, torch.Tensor] | None = None,
    *,
    layers: int = 0,
    lm_head: str = DEFAULT_HEAD,
) -> Qwen35Text:
    """The text model of the Qwen3.5 checkpoint in ``folder``; ``linear`` makes its linears (None: float ones, in
    ``dtype``, as every other tensor is); ``readout`` the decider's head, which replaces the LM head (A.15); ``raw``
    the checkpoint's tensors by full name when the caller has read them already (an int4 ``linear`` reads them).
    ``layers`` (unless 0) keeps only the first that many decoder layers (the ``layers`` setting; the others' weights
    are never read or unpacked); ``lm_head`` is the head's precision mode (`spinf.engine.head`), which a readout
    does not have."""
    folder = Path(folder)
    cfg, prefix = read_qwen35_config(folder)
    if layers:
        if layers > len(cfg.layer_types):
            raise ModelError(
                f"{folder}: the checkpoint has {len(cfg.layer_types)} layers, fewer than the {layers} asked"
            )
        cfg = attrs.evolve(cfg, layer_types=cfg.layer_types[:layers])
    if readout is not None and check_mode(lm_head) != DEFAULT_HEAD:
        raise ModelError(
            f"{folder}: lm_head {lm_head} sets an LM head's precision; the decider's readout runs in fp32"
        )
    raw = read_tensors(folder, "") if raw is None else raw
    if prefix + "embed_tokens.weight" not in raw:
        raise ModelError(f"{folder}: the checkpoint has no {prefix}embed_tokens.weight")
    head = raw.get("lm_head.weight")
    if head is None and readout is None and not cfg.tie_word_embeddings:
        raise ModelError(f"{folder}: the checkpoint has no lm_head.weight and does not tie its embeddings")

    def take(name: str) -> torch.Tensor:
        if name not in raw:
            raise ModelError(f"{folder}: the checkpoint has no tensor {name}")
        if raw[name].dtype in (torch.float8_e4m3fn, torch.float8_e5m2):  # its scales would be lost
            raise ModelError(f"{folder}: the tensor {name} is {raw[name].dtype}; this stack reads float or GPTQ int4")
        return raw[name].to(dtype)

    model = Qwen35Text(
        cfg,
        take,
        linear or float_linears(take),
        prefix,
        None if readout is not None else take(prefix + "embed_tokens.weight") if head is None else head.to(dtype),
        readout,
    )
    model.head_mode = check_mode(lm_head)
    return model.requires_grad_(False).eval()
