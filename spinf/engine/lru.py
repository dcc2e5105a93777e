"""A bounded mapping that drops the least recently used entry first: the engine's caches across requests.

The floor cache (`spinf.engine.loop`) and the compile cache (`spinf.engine.compiler.CompileCache`) keep what a
request computed from its own content-free parts (a floor's numbers, a query's tokens, a trie of branches) for the
next request that has the same parts. A size of 0 keeps nothing.
"""

from __future__ import annotations

import collections
from collections.abc import Hashable
from typing import Any


class LRU:
    def __init__(self, size: int):
        self.size = size
        self._entries: collections.OrderedDict[Hashable, Any] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Hashable) -> Any | None:
        found = self._entries.get(key)
        if found is not None:
            self._entries.move_to_end(key)
        return found

    def put(self, key: Hashable, value: Any) -> None:
        if not self.size:
            return
        self._entries[key] = value
        self._entries.move_to_end(key)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)
