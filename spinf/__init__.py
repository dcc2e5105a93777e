"""spinf-serve: an inference engine and HTTP server for decision models.

``from spinf import Engine`` gives the in-process engine; it is imported on first use so that importing the
package (for the web layer, the settings or the protocol) does not pull in torch.
"""

from spinf._version import __version__

__all__ = ["Engine", "__version__"]


def __getattr__(name: str):
    if name == "Engine":
        from spinf.engine.engine import Engine

        return Engine
    raise AttributeError(f"module 'spinf' has no attribute {name!r}")
