"""The layout of one pass: jobs back to back as flat per-token arrays (Python and numpy, no torch).

Within a job the prefix comes first (positions ``0 … P-1``), then the trie's nodes in pre-order; a node at depth
``d`` gets position ``P + d``, so siblings reuse positions and every prompt sees exactly its solo positions
(engine spec A.6). For each branch token the layout lists its parent's stream row, which gives its path (ancestors
root first, then itself); tree attention reads nothing else of the branch part of the pass.
"""

from __future__ import annotations

import attrs
import numpy as np

from spinf.engine.trie import PREFIX_END, Job


@attrs.frozen
class PassLayout:
    token_ids: list[int]
    positions: list[int]
    spans: list[tuple[int, int, int]]  # per job: (start row, prefix length, branch count)
    branch_rows: list[int]
    parents: list[int]  # per branch row: its parent's stream row, -1 for a child of the prefix
    read_rows: list[int]  # distinct rows whose next-token distribution is read
    read_columns: list[list[int]]  # per read row: the token ids read there
    read_index: dict[tuple[int, int, int], tuple[int, int]]  # (job, node, token) -> (read row no., column no.)
    end_rows: list[int] = attrs.field(factory=list)  # stream rows where an extraction slot starts
    end_index: dict[tuple[int, int], int] = attrs.field(factory=dict)  # (job, node) -> its place in end_rows
    # the prefixes' media items (`spinf.media.items`), each with the stream row of its first placeholder
    media: list[tuple[int, object]] = attrs.field(factory=list)
    fixed: list[int] = attrs.field(factory=list)  # per job: its `Job.fixed` (at most its prefix length)

    def vision_spans(self) -> list[tuple[int, int]]:
        """The stream rows ``[start, end)`` of each image's (or video frame's) placeholders: the groups whose rows
        may attend to each other (engine spec A.14.6)."""
        return [(row, row + item.num_tokens) for row, item in self.media if item.embedder == "vision"]

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def paths(self) -> list[list[int]]:
        """Per branch row, the stream rows of its path, root first (built on demand; pre-order puts every parent
        before its children)."""
        path_of: dict[int, list[int]] = {}
        out = []
        for row, parent in zip(self.branch_rows, self.parents, strict=True):
            path = [*path_of[parent], row] if parent >= 0 else [row]
            path_of[row] = path
            out.append(path)
        return out


@attrs.frozen
class LocalLayout:
    """A job's trie laid out on its own: what `build_pass` needs of it, in local rows (0 = the trie's first node in
    pre-order). It depends on the trie and the reads alone, not on the prefix, so jobs that share a trie (the compile
    cache gives one to every input with the same questions) share it too."""

    tokens: list[int]  # in pre-order
    depths: list[int]
    parents: list[int]  # the parent's local row, -1 for a child of the prefix
    reads: list[tuple[int, list[int], list[tuple[int, int]]]]  # per read row: local row (-1: the prefix's last
    # row), the token ids read there, the (node, token) reads in that order
    ends: list[tuple[int, int]] = attrs.field(factory=list)  # per extraction end: (node, local row or -1)


def local_layout(job: Job) -> LocalLayout:
    """The job's `LocalLayout`, kept on its trie for the next job with the same trie and reads."""
    trie = job.trie
    memo = getattr(trie, "layout_memo", None)
    if memo is not None and memo[0] is job.reads and memo[2] == job.ends:
        return memo[1]
    order = trie.preorder()
    row_of = [0] * len(order)
    for k, node in enumerate(order):
        row_of[node] = k
    tokens, depth, parent = trie.tokens, trie.depth, trie.parent
    rows: dict[int, tuple[int, list[int], list[tuple[int, int]]]] = {}
    for node, token in sorted(job.reads):
        row = -1 if node == PREFIX_END else row_of[node]
        if row not in rows:
            rows[row] = (row, [], [])
        rows[row][1].append(token)
        rows[row][2].append((node, token))
    local = LocalLayout(
        [tokens[node] for node in order],
        [depth[node] for node in order],
        [-1 if parent[node] == PREFIX_END else row_of[parent[node]] for node in order],
        list(rows.values()),
        [(node, -1 if node == PREFIX_END else row_of[node]) for node in sorted(job.ends)],
    )
    trie.layout_memo = (job.reads, local, set(job.ends))
    return local


def build_pass(jobs: list[Job]) -> PassLayout:
    """Lay out ``jobs`` in order; ``read_index`` maps each job's reads to where the scorer finds them."""
    token_ids: list[int] = []
    positions: list[int] = []
    spans, branch_rows, parents = [], [], []
    read_rows: list[int] = []
    read_columns: list[list[int]] = []
    read_index: dict[tuple[int, int, int], tuple[int, int]] = {}
    end_rows: list[int] = []
    end_index: dict[tuple[int, int], int] = {}
    media: list[tuple[int, object]] = []
    fixed: list[int] = []
    for j, job in enumerate(jobs):
        start, prefix_len = len(token_ids), len(job.prefix)
        if not prefix_len and (PREFIX_END in job.ends or any(node == PREFIX_END for node, _ in job.reads)):
            raise ValueError("a read at the end of an empty prefix has nothing to condition on")
        local = local_layout(job)
        base, n = start + prefix_len, len(local.tokens)
        token_ids.extend(job.prefix)
        positions.extend(range(prefix_len))
        media.extend((start + row, item) for row, item in job.media)
        token_ids.extend(local.tokens)
        positions.extend([prefix_len + d for d in local.depths])
        parents.extend([-1 if p < 0 else base + p for p in local.parents])
        branch_rows.extend(range(base, base + n))
        spans.append((start, prefix_len, n))
        fixed.append(min(job.fixed, prefix_len))
        for row, columns, reads in local.reads:
            k = len(read_rows)
            read_rows.append(base - 1 if row < 0 else base + row)
            read_columns.append(columns)
            for c, (node, token) in enumerate(reads):
                read_index[(j, node, token)] = (k, c)
        for node, row in local.ends:
            end_index[(j, node)] = len(end_rows)
            end_rows.append(base - 1 if row < 0 else base + row)
    return PassLayout(
        token_ids,
        positions,
        spans,
        branch_rows,
        parents,
        read_rows,
        read_columns,
        read_index,
        end_rows,
        end_index,
        media,
        fixed,
    )


def vision_groups(layout: PassLayout) -> np.ndarray | None:
    """Per stream row, the positions ``[start, end)`` of its image's placeholders, ``(0, 0)`` elsewhere
    (`AttentionPlan.groups`); None for a pass without images."""
    spans = layout.vision_spans()
    if not spans:
        return None
    groups = np.zeros((layout.num_tokens, 2), dtype=np.int64)
    positions = layout.positions
    for start, end in spans:
        groups[start:end] = (positions[start], positions[start] + end - start)
    return groups
