"""The engine loop's floors, read once per key when passes are shared (``share_passes``, batch-invariant engines).

`Floors` owns them: a floor key of a compiled call is served from an LRU cache (`FloorCache`), or from a read
already on its way for another call, or read in a floor read of the loop's own (`FloorRead`), whose numbers go to
every call waiting on the key and into the cache. A floor's numbers depend only on its key and the engine (engine
spec C.2), so a warm cache gives the bits a cold one gives. Pure Python, no torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import attrs

from spinf.engine.compiler import CompileCache, EngineShape, lay_out_floors
from spinf.engine.jobs import Prompt
from spinf.engine.lru import LRU
from spinf.engine.results import Floor, FloorKey, floor_numbers
from spinf.engine.work import Call, CallFloors, Kind, Work


class FloorCache(LRU):
    """Floor numbers by key, the least recently used dropped beyond ``size`` (0: nothing is kept)."""


@attrs.define(eq=False)
class FloorRead(Work):
    """Floor prompts the loop reads for every call waiting on their keys."""

    kind: ClassVar[Kind] = Kind.FLOOR_READ
    payer: Call  # the call whose compile asked first: its ``ran_tokens`` count the read's tokens
    prompts: list[Prompt] = attrs.field(factory=list)
    waiters: dict[FloorKey, list[tuple[Call, CallFloors]]] = attrs.field(factory=dict)
    live: int = 0  # waits of calls still in the loop; none left: the read is dropped


class Floors:
    """The cache, the reads under way by key, and the hits and misses so far."""

    def __init__(self, size: int):
        self.cache = FloorCache(size)
        self._reads: dict[FloorKey, FloorRead] = {}  # keys being read, and by which read
        self.hits = self.misses = 0

    def claim(
        self,
        call: Call,
        floors: CallFloors,
        wanted: dict[FloorKey, Prompt],
        bos: tuple[int, ...],
        shape: EngineShape,
        compile_cache: CompileCache,
    ) -> FloorRead | None:
        """Each key ``call`` wants: from the cache into ``floors``, or waited on in a read under way, or in a new
        read, laid out and returned for the loop to run (None when no key is read anew)."""
        fresh = FloorRead(payer=call)
        for key, prompt in wanted.items():
            cached = self.cache.get(key)
            if cached is not None:
                floors.numbers[key] = cached
                self.hits += 1
                continue
            read = self._reads.get(key)
            if read is None:
                read = self._reads[key] = fresh
                fresh.prompts.append(attrs.evolve(prompt, reads=[]))
                self.misses += 1
            else:
                self.hits += 1
            read.waiters.setdefault(key, []).append((call, floors))
            read.live += 1
            floors.reads.append(read)
            floors.waiting += 1
        if not fresh.prompts:
            return None
        lay_out_floors(bos, fresh.prompts, shape, fresh.jobs, compile_cache)
        return fresh

    def read(self, read: FloorRead, handed: Callable[[Call], None]) -> None:
        """Hand out a finished read's numbers to the calls still waiting (``handed`` each call after each key) and
        keep them."""
        for prompt in read.prompts:
            numbers: Floor = floor_numbers(prompt, read.values)
            self.cache.put(prompt.key, numbers)
            for call, floors in read.waiters.get(prompt.key, []):
                if not call.finished:
                    floors.numbers[prompt.key] = numbers
                    floors.waiting -= 1
                    handed(call)

    @staticmethod
    def left(read: FloorRead) -> bool:
        """A call waiting on ``read`` left the loop; True when no call waits on it any more (it is not run)."""
        read.live -= 1
        return not read.live

    def forget(self, read: FloorRead) -> None:
        """``read`` ended: its keys are no longer under way."""
        for prompt in read.prompts:
            if self._reads.get(prompt.key) is read:
                del self._reads[prompt.key]

    def __len__(self) -> int:
        return len(self.cache)
