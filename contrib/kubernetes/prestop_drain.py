#!/usr/bin/env python3
"""Drain one spinf-serve server before it is stopped: take it out of rotation, then wait until its calls are done.

A Kubernetes ``preStop`` hook runs this in the server's container, before the kubelet sends SIGTERM; any other
process manager or balancer script can run it the same way (``python prestop_drain.py --url http://host:port``).
It needs only what the image has: Python's standard library and the installed ``spinf`` package.

1. **Drain.** ``POST /v0/drain`` with the trusted token (``--token``, else ``SPINF_TRUSTED_TOKEN``,
   ``SPINF_ENGINE_TOKEN`` or ``SPINF_TOKEN``: a lone access token is trusted too). With no token the server trusts
   nobody, so the marker file (``SPINF_DRAIN_FILE``) is created instead, as the server's own drain would: that only
   works on the server's machine, which is where a ``preStop`` hook runs. ``/readyz`` answers 503 from then on and
   the balancers take the server out of rotation; the calls in flight and any that still arrive are served.
2. **Wait.** ``/metrics`` is read every ``POLL_S`` until, at least ``--settle-s`` after the drain (the time the
   balancers need to see ``/readyz`` fail), no call is in flight (``spinf_requests_in_flight``) and none has been
   answered for ``--quiet-s`` (the probes and ``/metrics`` do not count), or until ``--timeout-s`` have passed.

Exit status: 0 once drained and quiet; 1 when ``--timeout-s`` passed first (the server is drained all the same, and
SIGTERM's shutdown then gives the calls left ``shutdown_s`` more); 2 when the drain was refused or the server could
not be reached. The rule for ``terminationGracePeriodSeconds`` (contrib/kubernetes/deployment.yaml): at least
``--timeout-s`` plus ``SPINF_SHUTDOWN_S`` plus a margin for the exit itself.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from spinf.server.drain_marker import set_draining

POLL_S = 0.25
PROBES = frozenset({"/healthz", "/readyz", "/livez", "/metrics"})  # answered to the orchestrator, not to callers


class DrainRefused(Exception):
    """The server did not take the drain (a wrong token, another answer than 200, or no answer at all)."""


def default_token() -> str:
    for name in ("SPINF_TRUSTED_TOKEN", "SPINF_ENGINE_TOKEN", "SPINF_TOKEN"):
        if os.environ.get(name):
            return os.environ[name]
    return ""


def start_drain(url: str, token: str, timeout_s: float = 5.0) -> None:
    """Put the server at ``url`` in the draining state: ``POST /v0/drain`` with ``token``, or the marker file."""
    if not token:
        set_draining(True)
        return
    request = urllib.request.Request(
        f"{url}/v0/drain", data=b"", method="POST", headers={"Authorization": f"Bearer {token}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:
            answer.read()
    except urllib.error.HTTPError as error:
        raise DrainRefused(f"POST {url}/v0/drain answered {error.code}: {error.read()[:200]!r}") from error
    except OSError as error:
        raise DrainRefused(f"POST {url}/v0/drain failed: {error}") from error


def read_load(url: str, timeout_s: float = 5.0) -> tuple[int, int]:
    """(calls in flight, calls answered so far) from the server's ``/metrics``."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=timeout_s) as answer:
        text = answer.read().decode()
    in_flight, answered = 0, 0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "spinf_requests_in_flight":
                in_flight = int(sample.value)
            elif sample.name == "spinf_requests_total" and sample.labels.get("route") not in PROBES:
                answered += int(sample.value)
    return in_flight, answered


def wait_quiet(url: str, *, settle_s: float, quiet_s: float, timeout_s: float) -> bool:
    """Wait until, ``settle_s`` after now at the earliest, nothing is in flight and nothing was answered for
    ``quiet_s``; False when ``timeout_s`` passed first. A failed read of ``/metrics`` counts as not quiet."""
    start = time.monotonic()
    quiet_since, last_answered = None, None  # since the first read that found it quiet
    while (now := time.monotonic()) - start < timeout_s:
        try:
            in_flight, answered = read_load(url)
        except OSError:
            in_flight, answered = 1, None
        if in_flight or answered != last_answered:
            quiet_since, last_answered = None, answered
        elif quiet_since is None:
            quiet_since = now
        elif now - start >= settle_s and now - quiet_since >= quiet_s:
            return True
        time.sleep(POLL_S)
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    port = os.environ.get("SPINF_PORT") or "8000"
    parser.add_argument("--url", default=f"http://127.0.0.1:{port}", help="the server (default: this host's)")
    parser.add_argument("--token", default=default_token(), help="the trusted token (default: from SPINF_*)")
    parser.add_argument("--settle-s", type=float, default=5.0, help="the least wait after the drain")
    parser.add_argument("--quiet-s", type=float, default=2.0, help="how long no call may be answered")
    parser.add_argument("--timeout-s", type=float, default=45.0, help="the longest wait, the drain included")
    args = parser.parse_args(argv)
    url = args.url.rstrip("/")
    start = time.monotonic()
    try:
        start_drain(url, args.token)
    except DrainRefused as error:
        print(f"prestop-drain: {error}", file=sys.stderr)
        return 2
    left_s = args.timeout_s - (time.monotonic() - start)
    if not wait_quiet(url, settle_s=args.settle_s, quiet_s=args.quiet_s, timeout_s=left_s):
        print(f"prestop-drain: calls still arriving or in flight after {args.timeout_s:g} s", file=sys.stderr)
        return 1
    print(f"prestop-drain: drained and quiet after {time.monotonic() - start:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
