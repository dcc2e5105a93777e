"""The mixture-of-experts block of the Gemma 4 26B A4B (``enable_moe_block``): router, experts, and how their output
joins the dense MLP's.

Beside each layer's dense MLP sits a block of ``num_experts`` small GELU-gated MLPs (``moe_intermediate_size`` wide).
A router reads the layer's residual stream after attention (normed without a weight, times its own ``scale`` and
1/sqrt(hidden)), scores every expert, and sends each token to its ``top_k_experts`` best; a token's weights are the
router's softmax renormalised over the chosen ones, each times its expert's ``per_expert_scale``. The experts read
the residual normed by ``pre_feedforward_layernorm_2``; their weighted sum, normed by
``post_feedforward_layernorm_2``, is added to the dense MLP's output normed by ``post_feedforward_layernorm_1``, and
the layer's ``post_feedforward_layernorm`` then norms that sum as it normed the dense output alone.

A row's result never depends on what else is routed, on either path:

* the chosen experts come from a stable sort of the fp32 router logits (equal logits go to the lower expert index,
  on both devices), and the weights are element-wise with the sum over the k chosen taken in rank order;
* each expert's rows go through products whose rows do not depend on the row count: `row_stable_mm` on the CPU, on a
  GPU the grouped kernel of `spinf.engine.kernels.experts` (every expert's rows in one launch per projection, one
  fixed tile, no split along the inputs);
* a row's k outputs are combined in the order of their rank (first choice first), each rounded to the model dtype
  after its weight as transformers rounds it, summed in fp32: never in the order the experts happen to come.

Quantization: under fp8s each expert's projections are e4m3 with one scale per expert and part (gate, up; down) and
a static input scale per expert and projection, named ``layers.<i>.experts.<e>.gate_up`` and ``...down`` in the
table; calibration records them from the rows routed to that expert. An expert no calibration row reached takes the
largest input scale the layer's other experts have for that projection (the widest range: it clips least); a layer
without any is a `ScaleTableMismatch` (a calibration that scored one token reached ``top_k_experts`` experts in every
layer). These names are not in `Gemma4Text.linear_names`, which lists what a table must name. Under the on-the-fly
schemes (fp8, fp8row, w8a16, w8a8) the experts stay in the model dtype; the router always does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import attrs
import torch
import torch.nn.functional as F
from torch import nn

from spinf.engine.gemm import stable_mm
from spinf.engine.gemma4.config import TextConfig
from spinf.engine.norm import rms_norm
from spinf.engine.quant import Fp8Weight, fp8_matmul, quantize
from spinf.engine.scales import ScaleTableMismatch

PROJECTIONS = ("gate_up", "down")  # each expert's two products, by parameter name


@attrs.frozen
class ExpertsFp8:
    """One projection of every expert in e4m3: ``data`` [experts, out, in], ``scale`` fp32 [experts, out] (each
    part's scale on its rows), and each expert's static input scale (``inputs``, also as fp32 [experts] on the
    weights' device for the kernel)."""

    data: torch.Tensor
    scale: torch.Tensor
    inputs: tuple[float, ...]
    input_scales: torch.Tensor

    def expert(self, e: int) -> Fp8Weight:
        return Fp8Weight(self.data[e], self.scale[e])


def checkpoint_state(raw: dict[str, torch.Tensor], p: str) -> dict[str, torch.Tensor]:
    """A layer's expert weights under this module's names (``moe.``), taken from the checkpoint's (prefix ``p``)."""
    names = {
        "router": "router.proj.weight",
        "router_scale": "router.scale",
        "expert_scale": "router.per_expert_scale",
        "gate_up": "experts.gate_up_proj",
        "down": "experts.down_proj",
        "pre_norm": "pre_feedforward_layernorm_2.weight",
        "mlp_norm": "post_feedforward_layernorm_1.weight",
        "experts_norm": "post_feedforward_layernorm_2.weight",
    }
    return {f"moe.{ours}": raw.pop(p + theirs) for ours, theirs in names.items()}


class MoeBlock(nn.Module):
    """One layer's router and experts, and the norms that join their output to the dense MLP's."""

    def __init__(self, cfg: TextConfig):
        super().__init__()
        hidden, inner, count = cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts
        self.top_k, self.eps, self.hidden = cfg.top_k_experts, cfg.rms_norm_eps, hidden
        self.router = nn.Parameter(torch.empty(count, hidden))
        self.router_scale = nn.Parameter(torch.ones(hidden))
        self.expert_scale = nn.Parameter(torch.ones(count))
        self.gate_up = nn.Parameter(torch.empty(count, 2 * inner, hidden))  # gate rows, then up rows
        self.down = nn.Parameter(torch.empty(count, hidden, inner))
        for name in ("pre_norm", "mlp_norm", "experts_norm"):
            self.register_parameter(name, nn.Parameter(torch.ones(hidden)))
        self.fp8: dict[str, ExpertsFp8] = {}  # projection -> its e4m3 weights (fp8s)

    def forward(
        self,
        h: torch.Tensor,
        dense: torch.Tensor,
        prefix: str = "",
        observer: Callable[[str, torch.Tensor], None] | None = None,
    ) -> torch.Tensor:
        """The feed-forward output [N, hidden] the layer norms and adds to ``h`` (the residual after attention):
        the dense MLP's output ``dense`` and the experts', each normed, summed. ``observer`` (calibration) sees
        each expert's inputs under ``prefix + "experts.<e>.<projection>"``."""
        weights, experts = self.route(rms_norm(h, None, self.eps))
        x = rms_norm(h, self.pre_norm, self.eps)
        n, k = experts.shape
        outputs = x.new_empty((n, k, x.shape[1]))
        for e in experts.unique().tolist():
            rows, ranks = (experts == e).nonzero(as_tuple=True)
            gate, up = self._product("gate_up", e, x[rows], prefix, observer).chunk(2, dim=-1)
            act = F.gelu(gate, approximate="tanh") * up
            outputs[rows, ranks] = self._product("down", e, act, prefix, observer)
        return self.join(dense, self.mix(outputs, weights), rms_norm)

    def fused(self, h: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        """`forward` on a GPU in bf16, without a host sync (so a CUDA graph captures it): the norms through the
        row kernels, each projection of every expert in one grouped launch, the rank-ordered sum in one kernel."""
        from spinf.engine import kernels
        from spinf.engine.kernels import experts as grouped

        weights, chosen = self.route(kernels.norm_rows(h, None, self.eps))
        plan = grouped.expert_plan(chosen, self.expert_scale.shape[0])
        x = kernels.norm_rows(h, self.pre_norm, self.eps)
        gate_up = grouped.grouped_mm(x, self._stacked("gate_up"), plan, gather=True)
        out = grouped.grouped_mm(kernels.gelu_mul(gate_up), self._stacked("down"), plan)
        return self.join(dense, grouped.combine(out, plan, weights), self._norm_rows)

    def route(self, normed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's ``top_k`` experts ([N, k], best first) and their fp32 weights, from the residual normed
        without a weight. The weights are ``exp(l - l_best)`` over the chosen logits divided by their sum (the
        router's softmax renormalised over the chosen, as transformers computes it, up to rounding), the sum taken
        one rank after another, then times each expert's scale."""
        scaled = normed * self.router_scale * self.hidden**-0.5
        logits = stable_mm(scaled, self.router).float()
        top, experts = torch.sort(logits, dim=-1, descending=True, stable=True)
        top, experts = top[:, : self.top_k], experts[:, : self.top_k]
        exps = torch.exp(top - top[:, :1])
        total = exps[:, 0]
        for k in range(1, self.top_k):
            total = total + exps[:, k]
        return exps / total[:, None] * self.expert_scale[experts].float(), experts

    @staticmethod
    def mix(outputs: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """A row's expert outputs [N, k, hidden] weighted and summed in rank order: each term rounded to the model
        dtype (transformers' order), the sum in fp32, one rounding at the end."""
        total = (outputs[:, 0].float() * weights[:, :1]).to(outputs.dtype).float()
        for k in range(1, outputs.shape[1]):
            total = total + (outputs[:, k].float() * weights[:, k : k + 1]).to(outputs.dtype).float()
        return total.to(outputs.dtype)

    def join(self, dense: torch.Tensor, mixed: torch.Tensor, norm) -> torch.Tensor:
        return norm(dense, self.mlp_norm, self.eps) + norm(mixed, self.experts_norm, self.eps)

    @staticmethod
    def _norm_rows(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        from spinf.engine import kernels

        return kernels.norm_rows(x, weight, eps)

    def _product(
        self, name: str, e: int, x: torch.Tensor, prefix: str, observer: Callable[[str, torch.Tensor], None] | None
    ) -> torch.Tensor:
        """Expert ``e``'s projection ``name`` on its rows ``x`` (model dtype), e4m3 under fp8s."""
        if observer is not None:
            observer(f"{prefix}experts.{e}.{name}", x)
        if name in self.fp8:
            stacked = self.fp8[name]
            scale = stacked.inputs[e]
            return fp8_matmul(quantize(x, scale), stacked.expert(e), scale, out_dtype=x.dtype)
        return stable_mm(x, getattr(self, name)[e])

    def _stacked(self, name: str) -> torch.Tensor | ExpertsFp8:
        return self.fp8.get(name, getattr(self, name))

    def to_fp8s(self, scales: Mapping[str, float], prefix: str) -> None:
        """Every expert's projections to e4m3, with their static input scales from ``scales`` (an expert without
        one: the largest of its layer's for that projection); the float weights are released."""
        for name in PROJECTIONS:
            stacked = getattr(self, name)
            count, rows = stacked.shape[0], stacked.shape[1]
            names = [f"{prefix}experts.{e}.{name}" for e in range(count)]
            known = [scales[key] for key in names if key in scales]
            if not known:
                raise ScaleTableMismatch(f"the scale table has no scale for any expert's {prefix}experts.*.{name}")
            inputs = tuple(float(scales.get(key, max(known))) for key in names)
            parts = (rows // 2, rows // 2) if name == "gate_up" else None
            weights = [Fp8Weight.from_float(stacked[e], parts) for e in range(count)]
            self.fp8[name] = ExpertsFp8(
                data=torch.stack([w.data for w in weights]),
                scale=torch.stack([w.scale.float().reshape(-1).expand(rows) for w in weights]).contiguous(),
                inputs=inputs,
                input_scales=torch.tensor(inputs, dtype=torch.float32, device=stacked.device),
            )
            setattr(self, name, nn.Parameter(stacked.new_empty(0), requires_grad=False))

    def stored_weights(self) -> list[object]:
        return list(self.fp8.values())
