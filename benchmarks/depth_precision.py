"""How far the engine and the transformers baseline drift apart with depth, on the same random weights.

Run on the GPU machine: ``python benchmarks/depth_precision.py``. The J3 body is scored by both at the 12B width
with 2, 6, 12 and 48 layers in bf16, and the largest logprob difference is printed per row: the engine through
`Engine.score` on a checkpoint folder (`benchmarks.checkpoint`), the baseline with the folder's weights. Untrained
random layers amplify any difference in arithmetic, so the gap grows with depth; a bug shows at 2 layers already.
(The engine runs no fp32 on a GPU; the fp32 comparison is the CPU tests', tests/benchmarks/test_baseline.py.)
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.baseline import BENCH_LIMITS  # noqa: E402
from benchmarks.checkpoint import free_memory, open_engine, text_state, work_dir, write_checkpoint  # noqa: E402
from benchmarks.gemma12b import GEMMA_12B_TEXT_CONFIG, build_random_transformers_model, truncated  # noqa: E402
from benchmarks.gpu_jobsets import baseline_call, engine_call, max_difference, tiny_tokenizer  # noqa: E402
from benchmarks.jobsets import load_jobset  # noqa: E402


def engine_logprobs(folder, root: Path, body: dict) -> list:
    engine = open_engine(folder, root, quant="bf16", limits=BENCH_LIMITS)
    return engine_call(engine, body).logprobs


def main() -> None:
    body, device = load_jobset("j3"), torch.device("cuda")
    with work_dir(None) as root:
        for layers in (2, 6, 12, 48):
            config = truncated(GEMMA_12B_TEXT_CONFIG, layers)
            folder = write_checkpoint(root, config, device=device)
            ours = engine_logprobs(folder, root, body)
            free_memory()
            state = text_state(folder.path)
            reference = build_random_transformers_model(device, torch.bfloat16, config=config, state=state)
            baseline = baseline_call(reference, tiny_tokenizer(), 64, body)
            del reference, state
            free_memory()
            gap = max_difference(ours, baseline.logprobs)
            print(f"layers {layers:2d} bf16: max |engine - baseline| logprob {gap:.3g}", flush=True)


if __name__ == "__main__":
    main()
