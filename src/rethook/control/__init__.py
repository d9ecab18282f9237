"""The control surface: an in-process tracefs (:class:`~rethook.control.tracefs.Tracefs`), and
the control channel that serves it to other processes (:func:`listen`,
:class:`~rethook.control.client.RemoteTracefs`; docs/control.md).

Names are imported on first use, so ``rethook.control.listen()`` loads only the channel
(standard-library sockets) until a client asks for something.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from rethook.control.channel import listen
    from rethook.control.client import RemoteTracefs
    from rethook.control.tracefs import Tracefs, TracefsError

_WHERE = {
    "Tracefs": "rethook.control.tracefs",
    "TracefsError": "rethook.control.tracefs",
    "listen": "rethook.control.channel",
    "RemoteTracefs": "rethook.control.client",
}

__all__ = ["RemoteTracefs", "Tracefs", "TracefsError", "listen"]


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'rethook.control' has no attribute {name!r}")
    __import__(where)  # (as rethook.buffer's: importlib is not loaded at start-up)
    return getattr(sys.modules[where], name)
