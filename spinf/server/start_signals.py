"""The signals of ``spinf-serve serve`` from the first line of ``main`` until the server's own receivers take them.

Before the server runs, ``serve`` imports its modules, reads the settings, binds the address, checks the model and
builds the pack catalog (seconds, more with a slow pack source). Python's defaults would let a SIGHUP in that time
end the process without a word (the default action of SIGHUP), and a SIGTERM too. `install` puts handlers in place
first (`spinf.cli.main` calls it before any heavy import); from then on:

- **SIGHUP is remembered, never fatal.** A SIGHUP during a start usually comes from configuration management that
  has just edited the config file, and the start may have read the file before the edit: ignoring it could leave
  the old pack settings in use until the next reload. So every SIGHUP before the pack syncer listens is counted, and
  the supervisor asks the syncer for **one** reload once it runs (`take_hangups`), logging how many arrived.
- **SIGTERM and SIGINT end the start.** Until the server's event loop runs, the handler raises `StartInterrupted`
  in the main thread, which stops whatever the start is doing (an import, a catalog build waiting on the network);
  ``main`` logs it and exits with status 0, a shutdown's status (docs/deployment.md "Shutdown"). From
  `hold_stops` on (the supervisor calls it just before ``trio.run``) a stop is only remembered, and the drain
  controller's receiver, once open, takes it (`take_stop`) and shuts down as for any signal. Raising inside the
  event loop would tear Trio apart.

Once a Trio receiver for a signal is open it takes that signal; when it closes, Trio puts these handlers back, so a
late SIGHUP or a second SIGTERM during the shutdown is remembered and changes nothing. `restore` puts Python's
handlers back when ``main`` returns. Only the main thread can install handlers: elsewhere `install` does nothing.
"""

from __future__ import annotations

import signal
import threading

SIGNALS = tuple(getattr(signal, name) for name in ("SIGHUP", "SIGTERM", "SIGINT") if hasattr(signal, name))


class StartInterrupted(BaseException):
    """SIGTERM or SIGINT before the server ran: the start ends (a BaseException, like KeyboardInterrupt, so that no
    ``except Exception`` on the way swallows it)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class _State:
    installed: dict[int, object] = {}  # the signal -> the handler before ours
    hangups = 0
    stop: int | None = None  # the first SIGTERM or SIGINT
    raising = True


def _handle(signum: int, frame) -> None:
    if signum == getattr(signal, "SIGHUP", None):
        _State.hangups += 1
        return
    if _State.stop is None:
        _State.stop = signum
    if _State.raising:
        raise StartInterrupted(signum)


def install() -> bool:
    """Handle SIGHUP, SIGTERM and SIGINT as the module docstring says; False (nothing done) off the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return False
    _State.hangups, _State.stop, _State.raising = 0, None, True
    for signum in SIGNALS:
        _State.installed.setdefault(signum, signal.signal(signum, _handle))
    return True


def hold_stops() -> None:
    """From now on a SIGTERM or SIGINT is remembered for `take_stop`, not raised (the event loop is about to run)."""
    _State.raising = False


def take_hangups() -> int:
    """The SIGHUPs remembered since `install` or the last call (0 when none, or when nothing was installed)."""
    count, _State.hangups = _State.hangups, 0
    return count


def take_stop() -> int | None:
    """The SIGTERM or SIGINT remembered since `install`, once; None when none came."""
    signum, _State.stop = _State.stop, None
    return signum


def restore() -> None:
    """Python's handlers back (main thread only, as `install`)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum, previous in _State.installed.items():
        signal.signal(signum, previous)
    _State.installed.clear()
    _State.hangups, _State.stop, _State.raising = 0, None, True
