"""What the decoder holds, and slots packed into decode chunks that fit the decoder budget (engine spec C.4).

`CaptureCost` is a model's bytes per captured or generated row and per prefix (its ``capture_cost()``; the capture
budget counts a pass's slots with it, `spinf.engine.extractor`); `chunks` packs a decode's slots into chunks whose
working set (the copied prefixes and paths, every row's generated keys and values, the step's full-vocabulary
log-probs) stays within the decoder budget, each prefix's slots together, and refuses a slot that cannot fit alone
(413 ``request_too_large``).
"""

from __future__ import annotations

from typing import Protocol

import attrs

from spinf.errors import ApiError


class Start(Protocol):
    """Where a slot starts in its pass's captures (`spinf.engine.extraction.decoder.SlotStart`)."""

    @property
    def prefix(self) -> tuple[int, int]: ...  # its job's prefix: first captured row, length

    @property
    def path(self) -> tuple[int, ...]: ...  # the captured rows of its template path


class SlotTask(Protocol):
    """What packing a slot into a chunk reads of it (`spinf.engine.extraction.decoder.SlotTask`)."""

    @property
    def captured(self) -> object: ...  # the pass's captures: slots of one pass share its prefixes

    @property
    def start(self) -> Start: ...

    @property
    def rows(self) -> int: ...

    @property
    def steps(self) -> int: ...


# Bytes per row and vocabulary entry a step holds besides the buffers: the fp32 log-probs, the masked copy and the
# int64 sort keys of the deterministic top-k (`search.top`), with room for the sampler's.
LOGIT_BYTES = 24


@attrs.frozen
class CaptureCost:
    """What the decoder holds per captured or generated token, in bytes, over all layers: a prefix row
    (``prefix_token``), a template or generated row (``path_token``), and once per prefix (``per_prefix``). A model
    of attention layers only keeps every row's keys and values alike and nothing per prefix; the Qwen3.5 stack's
    recurrent layers keep no prefix row but its last ``tail`` (their convolution's reach), and the state after the
    prefix instead (``per_prefix``), and the pre-convolution rows and recurrence inputs of every path row."""

    prefix_token: int
    path_token: int
    per_prefix: int = 0
    tail: int = 0  # the prefix rows a recurrent layer keeps; 0: a model without recurrent layers

    def units(self, prefix_tokens: int, path_tokens: int) -> int:
        """One prefix and its paths in prefix rows' worth (what the capture budget counts, `capture_tokens`)."""
        path = -(-path_tokens * self.path_token // self.prefix_token)
        return prefix_tokens + path + -(-self.per_prefix // self.prefix_token)


def chunk_bytes(tasks: list[SlotTask], cost: CaptureCost, vocab: int) -> int:
    """The working set of decoding ``tasks`` together: the buffers' rows and the step's log-probs."""
    size = _ChunkSize(cost, vocab)
    for task in tasks:
        size.add(task)
    return size.bytes


class _ChunkSize:
    """`chunk_bytes` kept as running sums, so packing slots into chunks adds each slot once."""

    def __init__(self, cost: CaptureCost, vocab: int):
        self.cost, self.vocab = cost, vocab
        self.groups: set = set()
        self.prefix = self.paths = self.rows = self.steps = 0

    def add(self, task: SlotTask) -> None:
        group = (id(task.captured), task.start.prefix)
        if group not in self.groups:
            self.groups.add(group)
            self.prefix += task.start.prefix[1]
        self.paths += len(task.start.path)
        self.rows += task.rows
        self.steps = max(self.steps, task.steps)

    def with_task(self, task: SlotTask) -> int:
        """The bytes the chunk would take with ``task`` added (nothing is changed)."""
        group = (id(task.captured), task.start.prefix)
        new = group not in self.groups
        prefix = self.prefix + (task.start.prefix[1] if new else 0)
        rows, steps = self.rows + task.rows, max(self.steps, task.steps)
        paths = self.paths + len(task.start.path) + rows * steps
        return self._bytes(len(self.groups) + new, prefix, paths, rows)

    @property
    def bytes(self) -> int:
        return self._bytes(len(self.groups), self.prefix, self.paths + self.rows * self.steps, self.rows)

    @property
    def added(self) -> int:
        """The bytes beyond the captured rows it copies: the generated rows, the prefix states and the log-probs."""
        return self._bytes(len(self.groups), 0, self.rows * self.steps, self.rows)

    def _bytes(self, groups: int, prefix: int, paths: int, rows: int) -> int:
        cost = self.cost
        buffered = prefix * cost.prefix_token + paths * cost.path_token + groups * cost.per_prefix
        return buffered + rows * self.vocab * LOGIT_BYTES


def chunks(tasks: list[SlotTask], cost: CaptureCost, vocab: int, budget: int) -> list[list[int]]:
    """Task indices in chunks whose working set stays within ``budget`` bytes, each group's slots together; a slot
    over the budget alone is a 413.

    All the tasks go in one chunk when what it adds to the captures fits: that chunk reads every capture last, so
    the decoder lets each capture's keys and values go layer by layer as it copies them (`decoder._Chunk`), and
    the copies take the captures' place. Every chunk's model step streams the weights once, so one chunk instead of
    several saves a step of the whole model per token of the longest slot."""
    order = sorted(range(len(tasks)), key=lambda i: (id(tasks[i].captured), tasks[i].start.prefix[0], i))
    size = _ChunkSize(cost, vocab)
    for i in order:
        alone = chunk_bytes([tasks[i]], cost, vocab)
        if alone > budget:
            raise ApiError(
                413,
                "request_too_large",
                None,
                f"an extraction slot needs {alone / 2**30:.2f} GiB to decode; the decoder budget is "
                f"{budget / 2**30:.2f} GiB",
            )
        size.add(tasks[i])
    if size.added <= budget:
        return [order]
    out: list[list[int]] = []
    size = _ChunkSize(cost, vocab)
    for i in order:
        if not out or size.with_task(tasks[i]) > budget:
            out.append([])
            size = _ChunkSize(cost, vocab)
        out[-1].append(i)
        size.add(tasks[i])
    return out
