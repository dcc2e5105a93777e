"""Packing policy: which jobs share a pass (pure Python, no torch, so it is unit-testable).

Jobs are placed first-fit-decreasing into passes of at most the token budget; a job larger than the budget (a long
input, up to the engine maximum) runs alone. Ties keep submission order, so the same jobs always pack the same way.
Packing never changes a score: tree attention makes each question's numbers independent of its neighbours.
"""

from __future__ import annotations


def pack(sizes: list[int], budget: int) -> list[list[int]]:
    """Group job indices into passes; each pass totals at most ``budget`` tokens unless it holds one long job."""
    order = sorted(range(len(sizes)), key=lambda i: (-sizes[i], i))
    passes: list[list[int]] = []
    room: list[int] = []
    for i in order:
        size = sizes[i]
        if size > budget:
            passes.append([i])
            room.append(0)
            continue
        for p, free in enumerate(room):
            if size <= free:
                passes[p].append(i)
                room[p] -= size
                break
        else:
            passes.append([i])
            room.append(budget - size)
    return passes
