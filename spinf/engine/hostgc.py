"""The host's cyclic garbage collector around engine work.

A large call builds hundreds of thousands of small objects (tries, prompts, result dicts), next to none of them in
reference cycles, and each of CPython's older-generation collections traverses the whole heap, the model's modules
and the libraries included. With the device faked (`python benchmarks/host_work.py`), J2's host work (256 inputs ×
106 questions) took about twice as long with the collector running as with it paused; on the GPU that host time
competes with keeping the device fed. So:

- `paused()` pauses the cyclic collector while a call's host work runs and restores it afterwards (nested and
  concurrent uses are counted; the state before the outermost use is what comes back). Reference counting still
  frees almost everything at once; cycles made meanwhile wait for the next collection. The first collection after
  the pause traverses every young object still alive, so a caller frees what it no longer needs (the compiled
  request) before the pause ends: `Engine.score` holds it for the whole call and lets only the response out.
- Under a steady load the server's calls overlap (one compiling, one on the device, one having its response
  built), so the pauses can chain for as long as the load lasts and the collector would never run: cycles made by
  the calls and the HTTP layer would pile up for as long. So when a pause ends and the last collection is more
  than ``COLLECT_EVERY_S`` old, `paused()` collects once, paused or not: at most one full collection every few
  seconds, of a heap that `settle()` has made small.
- `settle()` collects once and moves every surviving object into the permanent generation (`gc.freeze`), so later
  collections no longer traverse the model and the libraries: the server calls it once its model is warm. The heap
  is unfrozen at exit, so the interpreter's last collection still frees its cycles.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import threading
import time

COLLECT_EVERY_S = 5.0
_lock = threading.Lock()
_users = 0
_was_enabled = False
_release_at_exit = False
_collected_at = time.monotonic()


@contextlib.contextmanager
def paused():
    global _users, _was_enabled
    with _lock:
        if _users == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _users += 1
    try:
        yield
    finally:
        with _lock:
            _users -= 1
            if _users == 0 and _was_enabled:
                gc.enable()
            overdue = _was_enabled and time.monotonic() - _collected_at > COLLECT_EVERY_S
        if overdue:
            collect()


def collect() -> None:
    """One full collection now, whatever the pauses (and the time of it, for `paused`)."""
    global _collected_at
    _collected_at = time.monotonic()
    gc.collect()


def settle() -> None:
    global _release_at_exit
    collect()
    gc.freeze()
    if not _release_at_exit:  # so that the collection at interpreter exit still sees the frozen objects
        atexit.register(gc.unfreeze)
        _release_at_exit = True
