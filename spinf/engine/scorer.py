"""Running jobs through the model: pack them into passes, run each pass, read the wanted log-probs.

The scorer decides nothing about the request; it returns plain Python floats keyed by ``(job, node, token)``.
Only the read rows go through the final norm and the LM head, and only the wanted columns leave the log-softmax.
"""

from __future__ import annotations

import contextlib
import time

import attrs
import torch

from spinf.engine.attention import AttentionPlan, JobSpan
from spinf.engine.layout import PassLayout, build_pass
from spinf.engine.model import Gemma4Text
from spinf.engine.packing import pack
from spinf.engine.trie import Job


@attrs.frozen
class RunStats:
    passes: int
    packed_tokens: int
    busy_s: float  # time inside the passes
    wall_s: float  # the whole run, host work included


def attention_plan(layout: PassLayout, device: torch.device) -> AttentionPlan:
    """Tensors of a pass layout; paths padded to the deepest branch token of the pass."""
    depth = max((len(p) for p in layout.paths), default=1)
    index = [p + [0] * (depth - len(p)) for p in layout.paths]
    mask = [[True] * len(p) + [False] * (depth - len(p)) for p in layout.paths]

    def as_tensor(data, dtype, shape=None):
        t = torch.tensor(data, dtype=dtype)
        return (t.reshape(shape) if shape else t).to(device)

    return AttentionPlan(
        positions=as_tensor(layout.positions, torch.long),
        jobs=tuple(JobSpan(*span) for span in layout.spans),
        branch_rows=as_tensor(layout.branch_rows, torch.long),
        path_index=as_tensor(index, torch.long, (len(index), depth)),
        path_mask=as_tensor(mask, torch.bool, (len(mask), depth)),
    )


@contextlib.contextmanager
def one_cpu_thread(device: torch.device):
    """On the CPU, run a pass on one intra-op thread.

    torch splits an elementwise op across threads at offsets that depend on the tensor's size, and handles each
    piece's last elements with scalar code that can differ in the last bit from the vectorised code (GELU does):
    with several threads a row's result would depend on how many rows share the pass. One thread keeps the only
    scalar tail at the end of each tensor, and the engine's tensor widths are multiples of the vector width.
    """
    if device.type != "cpu":
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class Scorer:
    """Runs jobs on one model; single-threaded by design (the executor owns it)."""

    def __init__(self, model: Gemma4Text, device: torch.device, token_budget: int):
        self.model = model
        self.device = device
        self.token_budget = token_budget

    def run_many(self, job_lists: list[list[Job]]) -> tuple[list[dict[tuple[int, int, int], float]], RunStats]:
        """Run several requests' jobs in shared passes; each request gets its values keyed by its own job indices."""
        started = time.perf_counter()
        owners = [(r, j) for r, jobs in enumerate(job_lists) for j in range(len(jobs))]
        jobs = [job for jobs in job_lists for job in jobs]
        values: list[dict[tuple[int, int, int], float]] = [{} for _ in job_lists]
        passes = pack([job.num_tokens for job in jobs], self.token_budget)
        busy, packed = 0.0, 0
        for members in passes:
            layout = build_pass([jobs[i] for i in members])
            pass_started = time.perf_counter()
            with one_cpu_thread(self.device):
                found = self.run_pass(layout)
            busy += time.perf_counter() - pass_started
            packed += layout.num_tokens
            for (j, node, token), (row, col) in layout.read_index.items():
                request, local = owners[members[j]]
                values[request][(local, node, token)] = found[row][col]
        return values, RunStats(len(passes), packed, busy, time.perf_counter() - started)

    @torch.inference_mode()
    def run_pass(self, layout: PassLayout) -> list[list[float]]:
        """Log-probs of each read row's wanted tokens, as nested lists in ``layout.read_columns`` order."""
        plan = attention_plan(layout, self.device)
        token_ids = torch.tensor(layout.token_ids, dtype=torch.long, device=self.device)
        hidden = self.model(token_ids, plan)  # [num_tokens, hidden]
        rows = torch.tensor(layout.read_rows, dtype=torch.long, device=self.device)
        logprobs = self.model.read_logprobs(hidden[rows])  # [read rows, vocab] fp32
        flat_rows = [r for r, cols in enumerate(layout.read_columns) for _ in cols]
        flat_cols = [c for cols in layout.read_columns for c in cols]
        picked = logprobs[torch.tensor(flat_rows), torch.tensor(flat_cols)].double().tolist()
        out, at = [], 0
        for cols in layout.read_columns:
            out.append(picked[at : at + len(cols)])
            at += len(cols)
        return out
