"""Opening a Qwen3.5 checkpoint for the engine: float or int4 GPTQ weights, the LM head or the decider's readout.

A float checkpoint runs as it is: ``fp32`` (the CPU) or ``bf16`` (a GPU); the Gemma stack's fp8 schemes are not
built for this stack. An int4 GPTQ checkpoint (`spinf.engine.qwen35.int4`) runs in one of the modes of api spec §9.8
(``int4-i8``, the default, with the outlier table shipped in the checkpoint or stored for its revision,
`spinf.engine.qwen35.outliers`; ``int4-f16``, ``int4-fp8``, ``int4-bf16``); the CPU emulates each. A checkpoint
with a readout (`spinf.engine.qwen35.readout`: the decider, engine spec A.15) scores with it instead of an LM head.
On a GPU with room to spare, an ``i8`` model keeps its int8 weights unpacked beside the packed ones
(`spinf.engine.qwen35.int4.keep_unpacked`): the same bits, less time.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from spinf.catalog.resolve import read_config
from spinf.engine.folder import read_tensors
from spinf.engine.hardware import INT4_FORMAT, INT4_PREFIX
from spinf.engine.head import DEFAULT_HEAD
from spinf.engine.qwen35 import readout
from spinf.engine.qwen35.config import read_qwen35_config
from spinf.engine.qwen35.model import Qwen35Text, load_qwen35
from spinf.engine.qwen35.outliers import missing_table_error, read_outliers
from spinf.errors import ModelError

if TYPE_CHECKING:
    from spinf.engine.qwen35.gptq import GptqConfig

log = logging.getLogger(__name__)

FLOAT_SCHEMES = {"fp32": torch.float32, "bf16": torch.bfloat16}
FLOAT_FORMATS = ("safetensors-f32", "safetensors-bf16")


def load_for_engine(
    folder: str | Path,
    *,
    scheme: str,
    device: str,
    weight_format: str,
    readout_expected: bool = False,
    model_id: str = "",
    revision: str = "",
    layers: int = 0,
    lm_head: str = DEFAULT_HEAD,
) -> Qwen35Text:
    """The model of the Qwen3.5 checkpoint in ``folder`` under ``scheme`` (as `choose_quant` gives it), on
    ``device``; ``weight_format`` the checkpoint's (`spinf.catalog.resolve.detect_format` or the manifest's).
    ``readout_expected``: the manifest says the head is a readout (a checkpoint without one is refused).
    ``model_id`` and ``revision`` key the store's outlier table, looked up when the folder ships none
    (`spinf.engine.qwen35.outliers`). ``layers`` and ``lm_head`` are the settings of those names (`load_qwen35`)."""
    folder = Path(folder)
    cfg, _ = read_qwen35_config(folder)
    on_cpu = torch.device(device).type == "cpu"
    head = None
    if readout.has_readout(folder):
        head = readout.read_readout(folder, hidden_size=cfg.hidden_size, vocab_size=cfg.vocab_size)
    elif readout_expected:
        raise ModelError(f"{folder}: a decision model needs readout.safetensors and decision_config.json (A.15)")
    if weight_format == INT4_FORMAT:
        from spinf.engine.qwen35 import int4
        from spinf.engine.qwen35.gptq import read_gptq_config

        gptq = read_gptq_config(folder)  # checks the quantization config (bits, groups, symmetry, no act-order)
        if not scheme.startswith(INT4_PREFIX):
            raise ModelError(f"{folder}: an int4 GPTQ checkpoint runs in the modes i8, f16, fp8, bf16, not {scheme}")
        log.info("GPTQ int4 %s, run as %s", _groups_text(gptq), scheme)  # its real group, whatever the format's name
        mode = scheme.removeprefix(INT4_PREFIX)
        outliers = None
        if mode == "i8":
            outliers = read_outliers(folder, model_id, revision)
            if outliers is None:
                raise missing_table_error(folder, model_id, revision)
        dtype = torch.float32 if on_cpu else torch.bfloat16
        raw = read_tensors(folder, "")
        linears = int4.int4_linears(raw, mode, outliers, device, None if gptq is None else gptq.group_size)
        model = load_qwen35(folder, dtype, linears, readout=head, raw=raw, layers=layers, lm_head=lm_head)
    else:
        _check_float(folder, weight_format)
        if scheme not in FLOAT_SCHEMES:
            raise ModelError(
                f"{folder}: the {scheme} scheme is not built for the Qwen3.5 stack; a float checkpoint runs in "
                f"{' or '.join(FLOAT_SCHEMES)} (an int4 GPTQ one in i8, f16, fp8 or bf16)"
            )
        model = load_qwen35(folder, FLOAT_SCHEMES[scheme], readout=head, layers=layers, lm_head=lm_head)
    model = model.to(device)
    if weight_format == INT4_FORMAT and mode == "i8" and not on_cpu:
        kept = int4.keep_unpacked(model, torch.device(device))
        log.info(
            "int4 i8: %s",
            f"the int8 weights kept unpacked ({kept / 2**30:.1f} GiB)"
            if kept
            else "the weights stay packed and are unpacked per call (no room to keep them unpacked)",
        )
    if head is not None:
        model.readout = head.to(device)
    return model


def _groups_text(gptq: GptqConfig | None) -> str:
    """How the log names a GPTQ checkpoint's groups (`INT4_FORMAT` is one name for every group size)."""
    from spinf.engine.qwen35.gptq import WHOLE_ROW

    if gptq is None:
        return "with no quantization_config (groups from the scales' shape)"
    if gptq.group_size == WHOLE_ROW:
        return "in whole-row groups (group_size -1)"
    return f"in groups of {gptq.group_size} inputs"


def _check_float(folder: Path, weight_format: str) -> None:
    """A checkpoint read as float weights must be one: a quantization config other than GPTQ (an fp8 one, say) would
    load without its scales, so it is refused by name (`load_qwen35` refuses a float8 tensor as it reads it)."""
    quantization = read_config(folder).get("quantization_config")
    if weight_format not in FLOAT_FORMATS or quantization is not None:
        method = quantization.get("quant_method") if isinstance(quantization, dict) else weight_format
        raise ModelError(
            f"{folder}: a Qwen3.5 checkpoint quantized with {method!r} is not read by this build; it reads float "
            "weights (safetensors) and symmetric GPTQ int4"
        )
