"""The plan of a pass on the Qwen3.5 stack (engine spec B.14.2): what its recurrent layers need beside the
tree-attention plan.

On a packed tree the GDN cannot be masked: a branch starts from its parent's final state. `pass_plan` cuts the
stream into segments (a new one where a token's path predecessor is not the previous row, where the predecessor
has several children, or where there is none); each segment starts from the kept final state of the segment that
ends at its predecessor, and the convolution reads each token's path predecessors through an index table with a
zero row (`Qwen35Plan.taps`). On a GPU the plan also holds the recurrent kernel's segment table
(`spinf.engine.kernels.gdn.segment_table`) and the full-attention layers' tree-attention kernel tables
(`kernel_config`). Images move later rotary positions (`mrope_positions`, A.14.3).
"""

from __future__ import annotations

import attrs
import numpy as np
import torch

from spinf.engine.attention import AttentionPlan, attention_plan
from spinf.engine.layout import PassLayout
from spinf.engine.qwen35.chunked import cut_rows, fixed_segments, plan_calls


@attrs.frozen
class Qwen35Plan:
    """What the layers need about a pass, beside the tree-attention plan.

    ``taps[r]`` lists the rows the convolution reads for row ``r``, oldest first and ``r`` itself last, as indices
    into the stream with one zero row in front (0: no such predecessor). ``segments`` are ``(first row, end row,
    source)`` in stream order, ``source`` the segment whose final state the segment starts from (-1: zero state);
    ``kept`` the segments some other segment starts from.

    On a GPU the plan also holds the kernel's view of the same segments (`spinf.engine.kernels.gdn.segment_table`):
    ``recurrent`` one row per segment, sorted by level, ``levels`` each level's first row (and the end), and
    ``num_slots`` the kept-states slots its rows refer to."""

    attention: AttentionPlan
    taps: torch.Tensor  # [num_tokens, kernel] int64
    segments: tuple[tuple[int, int, int], ...]
    kept: frozenset[int]
    # per row its (t, h, w) rotary positions (engine spec A.14.3: an image's tokens share t and add their row and
    # column); None: text only, t = h = w = the row's position
    positions3: torch.Tensor | None = None  # [num_tokens, 3] int64
    recurrent: torch.Tensor | None = None  # [num_segments, TABLE_COLUMNS] int32 on the GPU; None on the CPU
    levels: tuple[int, ...] = ()
    num_slots: int = 0
    # stream rows whose state after them the pass keeps (its capture's prefixes, each the end of a segment), in the
    # capture's order: the GPU kernel writes them to a buffer in this order
    captured_rows: tuple[int, ...] = ()
    # the segments that are a job's whole fixed prefix, run chunked (`spinf.engine.qwen35.chunked`), and its calls
    chunked: frozenset[int] = frozenset()
    chunked_calls: tuple = ()
    # on a GPU, per chunked segment (its index, its slot, its place among the captured states; -1: none): where the
    # token-by-token kernel finds its final state
    chunked_seeds: tuple[tuple[int, int, int], ...] = ()


def predecessors(layout: PassLayout) -> np.ndarray:
    """Per stream row, its path predecessor (the previous token of its own path), -1 for none."""
    pred = np.arange(-1, layout.num_tokens - 1, dtype=np.int64)
    branch_parent = dict(zip(layout.branch_rows, layout.parents, strict=True))
    for start, prefix_len, num_branch in layout.spans:
        pred[start] = -1
        base = start + prefix_len
        for row in range(base, base + num_branch):
            parent = branch_parent[row]
            pred[row] = parent if parent >= 0 else (base - 1 if prefix_len else -1)
    return pred


def segments(
    pred: np.ndarray, cut_after: frozenset[int] = frozenset()
) -> tuple[tuple[tuple[int, int, int], ...], frozenset[int]]:
    """The recurrence's segments of a stream with path predecessors ``pred`` (see `Qwen35Plan`); each row of
    ``cut_after`` ends a segment (a cut changes no bits: the next segment starts from the exact state)."""
    children = np.bincount(pred[pred >= 0], minlength=len(pred))
    out: list[list[int]] = []
    segment_of = np.full(len(pred), -1, dtype=np.int64)
    for row, p in enumerate(pred.tolist()):
        if p < 0 or p != row - 1 or children[p] > 1 or p in cut_after:
            source = int(segment_of[p]) if p >= 0 else -1
            if source >= 0 and out[source][1] != p + 1:
                raise ValueError(f"row {row}: its predecessor {p} does not end a segment (not a pre-order layout)")
            out.append([row, row + 1, source])
        else:
            out[-1][1] = row + 1
        segment_of[row] = len(out) - 1
    kept = frozenset(s for _, _, s in out if s >= 0)
    return tuple((a, b, s) for a, b, s in out), kept


def _job_of(layout: PassLayout, row: int) -> int:
    for j, (start, prefix_len, num_branch) in enumerate(layout.spans):
        if start <= row < start + prefix_len + num_branch:
            return j
    raise ValueError(f"row {row} is in no job of the pass")


def mrope_positions(layout: PassLayout) -> torch.Tensor | None:
    """Each row's (t, h, w) rotary positions [num_tokens, 3] (A.14.3), None for a pass without images: an image's
    tokens share its first position on t and add their row and column on h and w, and every later token of its job
    (the prefix's and every branch's) moves back by the image's `rope_shift`. Every media item of a pass on this
    stack is the Qwen tower's (`spinf.media.qwen_images.QwenVisionItem`: the engine decodes them so)."""
    items = layout.media
    if not items:
        return None
    base = np.asarray(layout.positions, dtype=np.int64)
    shift = np.zeros(len(base), dtype=np.int64)
    out = np.repeat(base[:, None], 3, axis=1)
    text = np.ones(len(base), dtype=bool)
    for row, item in sorted(items, key=lambda pair: pair[0]):
        start, prefix_len, num_branch = layout.spans[_job_of(layout, row)]
        first = base[row] - shift[row]
        r, c = np.divmod(np.arange(item.num_tokens), item.cols)
        out[row : row + item.num_tokens] = np.stack([np.full_like(r, first), first + r, first + c], axis=1)
        text[row : row + item.num_tokens] = False
        shift[row + item.num_tokens : start + prefix_len + num_branch] += item.rope_shift  # the job's later rows
    out[text] = (base - shift)[text][:, None]
    return torch.from_numpy(out)


def pass_plan(
    layout: PassLayout,
    kernel: int,
    device: torch.device | None = None,
    attention_shape: tuple[int, int] | None = None,
    attention: AttentionPlan | None = None,
    taps_buffer: torch.Tensor | None = None,
) -> Qwen35Plan:
    """The plan of a pass for a model whose convolution has ``kernel`` taps, with its tensors on ``device`` (None:
    the CPU). On a GPU, ``attention_shape`` (head dim, query heads per KV head) of the full-attention layers gives
    the plan the Triton tree-attention kernel's tables (`kernel_config`); None: torch tree attention.
    ``taps_buffer`` (a CUDA graph's, at least as many rows as the pass): the taps are written there, the rows past
    the pass's reading the zero row, and the plan's ``taps`` is that buffer."""
    device = device or torch.device("cpu")
    pred = predecessors(layout)
    taps = [np.arange(1, layout.num_tokens + 1, dtype=np.int64)]  # +1: row 0 of the padded stream is zeros
    back = pred
    for _ in range(kernel - 1):
        taps.append(back + 1)
        back = np.where(back >= 0, pred[np.maximum(back, 0)], -1)
    given = attention is not None  # the scorer's plan (its kernel tables, capture and media): kept as it is
    attention = attention if given else attention_plan(layout, device)
    capture = attention.capture
    captured_rows = () if capture is None else tuple(row for _, row in capture.prefixes if row >= 0)
    chunk = chunked_on(device)
    segs, kept = segments(pred, frozenset(captured_rows) | (cut_rows(layout) if chunk else frozenset()))
    chunked = fixed_segments(layout, segs) if chunk else frozenset()
    calls = plan_calls(segs, chunked, device)
    taps_rows = np.stack(taps[::-1], axis=1).copy()
    positions3 = mrope_positions(layout)
    positions3 = None if positions3 is None else positions3.to(device)
    if device.type != "cuda":
        taps_on = torch.from_numpy(taps_rows).to(device)
        return Qwen35Plan(
            attention=attention,
            taps=taps_on,
            segments=segs,
            kept=kept,
            positions3=positions3,
            captured_rows=captured_rows,
            chunked=chunked,
            chunked_calls=calls,
        )
    from spinf.engine.kernels import kernel_plan, tile_rows, to_device
    from spinf.engine.kernels.gdn import segment_table

    if attention_shape is not None and not given:
        rows = tile_rows(*attention_shape, kernel_config(*attention_shape))
        attention = attrs.evolve(attention, kernel=kernel_plan(layout, device, {rows}))
    table, levels, num_slots = segment_table(segs, kept, captured_rows, chunked)
    seeds = tuple(
        (s, int(slot), int(place))
        for s, (slot, place) in zip(sorted(chunked), table[: len(chunked), [3, 5]], strict=True)
    )
    if taps_buffer is None:
        taps_on = to_device(taps_rows, device)
    else:
        from spinf.engine.graphs import fill_padded

        fill_padded(taps_buffer, taps_rows)
        taps_on = taps_buffer
    return Qwen35Plan(
        attention=attention,
        taps=taps_on,
        segments=segs,
        kept=kept,
        recurrent=to_device(table, device),
        levels=levels,
        num_slots=num_slots,
        positions3=positions3,
        captured_rows=captured_rows,
        chunked=chunked,
        chunked_calls=calls,
        chunked_seeds=seeds,
    )


def chunked_on(device: torch.device) -> bool:
    """Whether passes on ``device`` run the fixed prefixes chunked: on the CPU always (the fp32 reference), on a
    GPU when fla's kernels load pinned (`spinf.engine.kernels.chunked`, which logs why once when they do not)."""
    if device.type != "cuda":
        return True
    from spinf.engine.kernels.chunked import chunked_kernel

    return chunked_kernel()[0] is not None


def kernel_config(head_dim: int, group: int) -> tuple[int, ...]:
    """The Triton tree-attention kernel's configuration for these layers: the Gemma stack's for the head dim,
    except that a group whose heads fill no power-of-two tile (the 27B's 6 query heads per KV head) is taken
    2 heads (or 1) per program."""
    from spinf.engine.kernels.attention import config_for

    pairs, heads, *rest = config_for(head_dim)
    if not heads and pairs % group:
        heads = 2 if group % 2 == 0 else 1
    return (pairs, heads, *rest)
