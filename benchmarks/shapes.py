"""The model shapes a benchmark run measures: ``--shape``, ``--scaled`` and ``--layers`` read into a text config.

`SHAPES` names them (benchmarks.gemma12b, benchmarks.gemma31b with its vision tower, benchmarks.gemma_e4b,
benchmarks.gemma26b); `model_config` gives a run's text config, `model_vision` the tower written beside it, and
`model_title` the words a results section calls it by. The checkpoint writer (`benchmarks.checkpoint`) and every
job-set benchmark read them from here, below both of them.
"""

from __future__ import annotations

import argparse

from benchmarks.gemma12b import GEMMA_12B_TEXT_CONFIG, scaled, truncated
from benchmarks.gemma26b import GEMMA_26B_A4B_TEXT_CONFIG, scaled_26b
from benchmarks.gemma31b import GEMMA_31B_TEXT_CONFIG, GEMMA_31B_VISION_CONFIG, scaled_31b
from benchmarks.gemma_e4b import GEMMA_E4B_TEXT_CONFIG, scaled_e4b, truncated_e4b

SHAPES = ("12b", "31b", "e4b", "26b-a4b")
SHAPE_HELP = "the 12B (default), the 31B (with its tower), the E4B (per-layer inputs, KV-shared layers) or the 26B A4B"


def model_config(args: argparse.Namespace) -> dict:
    """The text config a run measures: the ``--shape`` (12B unless said), ``--scaled`` down, or ``--layers`` deep at
    full width."""
    if getattr(args, "shape", "12b") == "26b-a4b":  # benchmarks.gemma26b: the 26B A4B's experts
        if args.scaled:
            return scaled_26b()
        return truncated(GEMMA_26B_A4B_TEXT_CONFIG, args.layers) if args.layers else GEMMA_26B_A4B_TEXT_CONFIG
    if getattr(args, "shape", "12b") == "e4b":
        if args.scaled:
            return scaled_e4b()
        return truncated_e4b(args.layers) if args.layers else GEMMA_E4B_TEXT_CONFIG
    if getattr(args, "shape", "12b") == "31b":
        full = GEMMA_31B_TEXT_CONFIG
        if args.scaled:
            return scaled_31b()[0]
    else:
        full = GEMMA_12B_TEXT_CONFIG
        if args.scaled:
            return scaled(GEMMA_12B_TEXT_CONFIG)
    return truncated(full, args.layers) if args.layers else full


def model_vision(args: argparse.Namespace) -> dict | None:
    """The vision tower the folder holds beside the text model (the engine never reads it): the 31B's, or none."""
    if getattr(args, "shape", "12b") != "31b":
        return None
    return scaled_31b()[1] if args.scaled else GEMMA_31B_VISION_CONFIG


def model_title(args: argparse.Namespace) -> str:
    size = getattr(args, "shape", "12b").upper()
    if args.scaled:
        return f"the scaled-down {size}-shaped random model"
    whole = f"the {size}-shaped random model"
    return f"{whole} cut to {args.layers} layers" if args.layers else whole
