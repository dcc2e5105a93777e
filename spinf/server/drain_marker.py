"""The drain marker (api spec §3.4): a file whose presence makes ``/readyz`` answer 503 while work goes on.

Draining is not a phase of the lifecycle: the marker outlives the request that set it and the process itself, so
``/readyz`` checks it on every call. ``POST /v0/drain`` creates it and ``DELETE /v0/drain`` removes it; a pre-stop
hook may create it without a request (contrib/kubernetes/prestop_drain.py).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def drain_file() -> Path:
    """The drain marker (api spec §3.4): ``SPINF_DRAIN_FILE``, else ``spinf-drain`` in the temporary folder."""
    return Path(os.environ.get("SPINF_DRAIN_FILE") or Path(tempfile.gettempdir()) / "spinf-drain")


def is_draining() -> bool:
    return drain_file().exists()


def set_draining(on: bool) -> None:
    """Create (empty) or remove the drain marker; the state outlives the request and the process."""
    path = drain_file()
    if on:
        path.write_bytes(b"")
    else:
        path.unlink(missing_ok=True)
