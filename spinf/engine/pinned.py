"""Host arrays to the GPU through reused pinned memory: a pass's small tables without a pinned allocation each.

A pass sends a dozen small host arrays to the device (its tokens, the kernel plans' tables, the recurrence's table,
the rows the head reads). Each went through ``tensor.pin_memory()``, a fresh page-locked buffer from torch's host
allocator, and with the device busy the allocator often cannot reuse a cached one (a block is free only once the
copy that read it has run): on an H100, 13 such calls took 0.5 to 6 ms of a 300-token Qwen call's host time, all
of it before the first kernel.

Here the arrays are staged in one page-locked buffer in two halves, used in turn: a half fills array after array
(each at a 256-byte boundary); when the next array does not fit, an event is recorded behind the copies that read
the half, and the other half is used, after waiting for the event recorded when it was left (long done: a half
holds many passes' tables). An array larger than a half, or one staged while a CUDA graph is being captured (whose
copy would be replayed later from memory reused since), gets a pinned buffer of its own as before. One stager per
device, used by the thread that launches the passes (the GPU executor), like the stream the copies go to.
"""

from __future__ import annotations

import numpy as np
import torch

HALF_BYTES = 1 << 21  # each half of the staging buffer: 2 MiB
ALIGN = 256


class PinnedStager:
    """Stages host arrays in two reused halves of one page-locked buffer (see the module's text)."""

    def __init__(self, device: torch.device, half_bytes: int = HALF_BYTES):
        self.device = device
        self.half_bytes = half_bytes
        self.buffer = torch.empty(2 * half_bytes, dtype=torch.uint8, pin_memory=True)
        self.half = 0  # the half being filled
        self.offset = 0  # the next free byte in it
        self.left: list[torch.cuda.Event | None] = [None, None]  # recorded when each half was last left

    def to_device(self, a: np.ndarray) -> torch.Tensor:
        """``a`` as a new tensor on the device, copied without blocking the host."""
        a = np.ascontiguousarray(a)
        source = torch.from_numpy(a)
        out = torch.empty(source.shape, dtype=source.dtype, device=self.device)
        self.copy_into(out, a)
        return out

    def copy_into(self, target: torch.Tensor, a: np.ndarray) -> None:
        """``a`` into the device tensor ``target`` (its shape and dtype), copied without blocking the host."""
        a = np.ascontiguousarray(a)
        if a.nbytes == 0:
            return
        source = torch.from_numpy(a)
        if a.nbytes > self.half_bytes or torch.cuda.is_current_stream_capturing():
            target.copy_(source.pin_memory(), non_blocking=True)
            return
        staged = self._stage(a.nbytes).view(source.dtype).view(source.shape)
        staged.copy_(source)
        target.copy_(staged, non_blocking=True)

    def _stage(self, nbytes: int) -> torch.Tensor:
        """``nbytes`` of the half being filled, moving to the other half when they do not fit."""
        if self.offset + nbytes > self.half_bytes:
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(self.device))
            self.left[self.half] = event
            self.half = 1 - self.half
            self.offset = 0
            waiting = self.left[self.half]
            if waiting is not None:  # the copies that read this half the last time round have run
                waiting.synchronize()
        start = self.half * self.half_bytes + self.offset
        self.offset += -(-nbytes // ALIGN) * ALIGN
        return self.buffer[start : start + nbytes]


_stagers: dict[torch.device, PinnedStager] = {}


def stager(device: torch.device) -> PinnedStager:
    """The device's stager (made on first use)."""
    device = torch.device(device)
    if device.index is None:
        device = torch.device(device.type, torch.cuda.current_device())
    found = _stagers.get(device)
    if found is None:
        found = _stagers[device] = PinnedStager(device)
    return found
