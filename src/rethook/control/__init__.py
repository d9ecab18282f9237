"""The control surface: an in-process tracefs (:class:`~rethook.control.tracefs.Tracefs`)."""

from rethook.control.tracefs import Tracefs, TracefsError

__all__ = ["Tracefs", "TracefsError"]
