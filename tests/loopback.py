"""A threaded HTTP server on 127.0.0.1 for the fakes that sit at an HTTP boundary (a ``/v1/score`` server, the Hub).

A fake subclasses `LoopbackServer` with its handler class; the handler reaches the fake as ``self.server.fake`` and
answers with `JsonHandler.answer`.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class JsonHandler(BaseHTTPRequestHandler):
    """A request handler that answers JSON (or given bytes) and logs nothing."""

    def answer(self, status: int, payload: object, headers: dict[str, str]) -> None:
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in headers.items():
            self.send_header(name, value)
        try:
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            # the client went away (a test that interrupts its run): socketserver would print the traceback on
            # stderr from this thread, into whichever test is capturing stderr at that moment
            pass

    def log_message(self, *args) -> None:
        pass


class LoopbackServer:
    """Serves ``handler`` on a free port of 127.0.0.1, in a thread, while in the ``with`` block."""

    def __init__(self, handler: type[JsonHandler]):
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.fake = self
        # shutdown() waits for the serving loop to look at its flag, every poll_interval (0.5 s by default)
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.01,), daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
