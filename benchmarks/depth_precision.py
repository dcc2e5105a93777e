"""How far the engine and the transformers baseline drift apart with depth, on the same random weights.

Run on the GPU machine: ``python benchmarks/depth_precision.py``. The J3 body is scored by both at the 12B width
with 2, 6, 12 and 48 layers, in fp32 and bf16, and the largest logprob difference is printed per row. Untrained
random layers amplify any difference in arithmetic, so the gap grows with depth; a bug shows at 2 layers already.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.gemma12b import (  # noqa: E402
    GEMMA_12B_TEXT_CONFIG,
    build_random_engine_model,
    build_random_transformers_model,  # noqa: E402
)
from benchmarks.gpu_jobsets import baseline_call, engine_call, max_difference, tiny_tokenizer  # noqa: E402
from benchmarks.jobsets import load_jobset  # noqa: E402
from spinf.engine.compiler import EngineShape  # noqa: E402
from spinf.engine.scorer import Scorer  # noqa: E402


def config_with(layers: int) -> dict:
    kinds = ["full_attention" if (i + 1) % 6 == 0 or i == layers - 1 else "sliding_attention" for i in range(layers)]
    return {**GEMMA_12B_TEXT_CONFIG, "num_hidden_layers": layers, "layer_types": kinds}


def main() -> None:
    body, tokenizer, device = load_jobset("j3"), tiny_tokenizer(), torch.device("cuda")
    for layers in (2, 6, 12, 48):
        for dtype in (torch.float32, torch.bfloat16):
            ours = build_random_engine_model(device, dtype, config=config_with(layers))
            engine = engine_call(Scorer(ours, device, 16_384), tokenizer, EngineShape(16_384, 65_536), body)
            del ours
            torch.cuda.empty_cache()
            reference = build_random_transformers_model(device, dtype, config=config_with(layers))
            baseline = baseline_call(reference, tokenizer, 64, body)
            del reference
            torch.cuda.empty_cache()
            gap = max_difference(engine.logprobs, baseline.logprobs)
            print(f"layers {layers:2d} {dtype}: max |engine - baseline| logprob {gap:.3g}", flush=True)


if __name__ == "__main__":
    main()
