"""The host's share of a call, with the device faked: the collector running against paused (spinf.engine.hostgc).

Run anywhere: ``python benchmarks/host_work.py [--jobs J2] [--repeats 3]``. Each job set's first body goes through
`engine_call`'s path (parse, `score_streamed`: compile, lay out, plan the kernels, read back, build results) on a
scorer whose passes return constant log-probs at once, so only host work is timed. Each round times the call with
the cyclic collector running and then paused as `Engine.score` pauses it; the ratio of the medians is printed
(absolute times belong to this machine only). Nothing is written to RESULTS.md.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.gpu_jobsets import job_bodies, parse_body, tiny_tokenizer  # noqa: E402
from spinf.engine import hostgc  # noqa: E402
from spinf.engine.compiler import EngineShape  # noqa: E402
from spinf.engine.kernels import kernel_plan, tile_rows  # noqa: E402
from spinf.engine.pipeline import score_streamed  # noqa: E402
from spinf.engine.scorer import Launched, Scorer  # noqa: E402

# the 12B's layer kinds: (head dim, query heads per KV head)
LAYER_KINDS = {(256, 2), (512, 16)}


class HostOnlyScorer(Scorer):
    """A scorer without a model: each pass is laid out and planned as on a GPU, and reads back -0.5 everywhere."""

    def __init__(self, token_budget: int):
        self.device = torch.device("cpu")
        self.token_budget = token_budget
        self._tile_sizes = LAYER_KINDS

    def launch(self, layout) -> Launched:
        kernel_plan(layout, self.device, {tile_rows(dim, group) for dim, group in LAYER_KINDS})
        picks = sum(len(cols) for cols in layout.read_columns)
        return Launched(torch.full((picks,), -0.5), 0.0)


def timed_call(scorer: Scorer, shape: EngineShape, body: dict, paused: bool) -> float:
    tokenizer = tiny_tokenizer()
    started = time.perf_counter()
    if paused:
        with hostgc.paused():
            results = score_streamed(scorer, tokenizer, shape, parse_body(body)).results
    else:
        results = score_streamed(scorer, tokenizer, shape, parse_body(body)).results
    seconds = time.perf_counter() - started
    del results
    return seconds


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", default="J2")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    shape = EngineShape(16_384, 65_536)
    scorer = HostOnlyScorer(shape.token_budget)
    gc.enable()
    for name in args.jobs.split(","):
        bodies, _ = job_bodies(name.strip(), None)
        body = bodies[0]
        timed_call(scorer, shape, body, paused=True)  # warm caches (tokenizer, templates)
        running, paused = [], []
        for _ in range(args.repeats):
            running.append(timed_call(scorer, shape, body, paused=False))
            paused.append(timed_call(scorer, shape, body, paused=True))
        ratio = statistics.median(running) / statistics.median(paused)
        print(f"{name}: host work {ratio:.2f}x as long with the collector running as with it paused", flush=True)


if __name__ == "__main__":
    main()
