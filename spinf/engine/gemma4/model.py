"""The Gemma 4 text decoder as the engine runs it: one flat pass of many jobs under tree attention.

Written as plain modules (gpt-fast style) and checked against transformers' definitions by the tests. Weights are
loaded from memory-mapped safetensors onto modules built on the ``meta`` device; q/k/v and gate/up are fused at
load so the forward stays a handful of GEMMs per layer (`spinf.engine.gemma4.layer`). The forward returns hidden
states; only the rows where an option token is read go through the final norm and the LM head
(`Gemma4Text.read_logprobs` on the CPU, `Gemma4Text.option_logprobs` on a GPU). On a GPU with bf16 activations each
layer runs its fused path, each handing the next its normed input; CUDA graphs replay small passes
(`Gemma4Text.pass_graphs`).

The small models (E2B/E4B) add per-layer input embeddings: a second table looked up by token, mixed with a
projection of the pass's input embeddings (`Gemma4Text.per_layer_inputs`), and gated into each layer's output.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping

import torch
from torch import nn

from spinf.engine.attention import BIDIRECTIONAL_IN_WINDOW, BIDIRECTIONAL_NONE, BIDIRECTIONAL_OR, AttentionPlan
from spinf.engine.extraction.budget import CaptureCost
from spinf.engine.gemma4.config import LayerSpec, TextConfig
from spinf.engine.gemma4.layer import LINEARS, DecoderLayer, kernels, plain_mm, rope_inv_freq
from spinf.engine.graphs import PassGraphs
from spinf.engine.head import DEFAULT_HEAD, HEAD_ROWS, head_logits, head_precision, head_rows, head_weight
from spinf.engine.norm import rms_norm
from spinf.engine.scales import ScaleTableMismatch
from spinf.engine.schemes import SCHEMES


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
        projected = plain_mm(h, self.per_layer_model_proj.weight) * cfg.hidden_size**-0.5
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
