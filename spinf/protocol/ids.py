"""Request ids: ``scr_`` followed by a 26-character ULID in Crockford base32 (api spec §2.2).

A ULID is a 48-bit millisecond timestamp then 80 random bits, so ids sort by creation time.
"""

from __future__ import annotations

import os
import time

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def new_request_id(now_ms: int | None = None) -> str:
    ms = int(time.time() * 1000) if now_ms is None else now_ms
    value = (ms & ((1 << 48) - 1)) << 80 | int.from_bytes(os.urandom(10), "big")
    chars = []
    for _ in range(26):
        chars.append(_CROCKFORD[value & 31])
        value >>= 5
    return "scr_" + "".join(reversed(chars))
