"""The LM head's precision modes (engine spec B.7, ``--lm-head``): which dtypes the tied-embedding product reads and
writes. The head itself (chunking, soft-capping, log-sum-exp) is each stack's ``option_logprobs``, ``full_logprobs``
and ``read_logprobs`` (`spinf.engine.stack.TextStack`); on a GPU both run read rows in chunks of `HEAD_ROWS`.

| mode | operands | logits |
|---|---|---|
| f32out (default) | the model dtype: the normed hidden rows and the embedding as loaded | fp32 |
| bf16 | both rounded to bf16 | rounded to bf16 (as vLLM) |
| fp32 | the final norm and the product in fp32 (the embedding cast once per pass, about 4 GB on the 12B) | fp32 |

On a bf16 model f32out is the bf16 × bf16 product with fp32 output, what the GPU has always run; on an fp32 model
(the CPU, the tiny model) it is the fp32 head itself, so `head_precision` names it ``fp32`` there, in the system
fingerprint too. On the CPU every mode is emulated in fp32 from operands rounded as the mode rounds them.
"""

from __future__ import annotations

import torch

from spinf.engine.gemm import row_stable_mm
from spinf.settings import SETTING

HEAD_MODES = ("f32out", "bf16", "fp32")
DEFAULT_HEAD = SETTING["lm_head"].default
HEAD_ROWS = 128  # the GPU head runs read rows in chunks of exactly this many (one shape per product and reduction)


def check_mode(mode: str) -> str:
    if mode not in HEAD_MODES:
        raise ValueError(f"lm_head {mode!r} is not one of {', '.join(HEAD_MODES)}")
    return mode


def head_precision(mode: str, model_dtype: torch.dtype) -> str:
    """The precision the head runs at (part 7 of the system fingerprint): f32out on an fp32 model is fp32."""
    return "fp32" if mode == "f32out" and model_dtype == torch.float32 else mode


def head_weight(weight: torch.Tensor, mode: str) -> torch.Tensor:
    """The tied embedding as the mode's product reads it (made once per pass)."""
    if mode == "fp32":
        return weight.float()
    return weight.to(torch.bfloat16) if mode == "bf16" else weight


def head_rows(hidden: torch.Tensor, mode: str) -> torch.Tensor:
    """The hidden rows as the mode's final norm reads them (fp32 under fp32, else as they are)."""
    return hidden.float() if mode == "fp32" else hidden


def head_logits(x: torch.Tensor, weight: torch.Tensor, mode: str) -> torch.Tensor:
    """fp32 logits ``x @ weight.T`` of normed rows ``x`` and a `head_weight`, in the mode's precision."""
    if mode == "bf16":
        x = x.to(torch.bfloat16)
    if not x.is_cuda:
        logits = row_stable_mm(x.float(), weight.float())
        return logits.to(torch.bfloat16).float() if mode == "bf16" else logits
    if x.dtype == torch.float32:
        return x @ weight.float().t()
    if mode == "bf16":
        return (x @ weight.t()).float()
    return torch.mm(x, weight.t(), out_dtype=torch.float32)
