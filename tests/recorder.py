"""A graph user that records everything it is told, for the engine tests."""

from __future__ import annotations

import itertools
import threading

from rethook.engine.engine import FgraphOps

_ids = itertools.count()


class Recorder(FgraphOps):
    """Accepts every call (or as ``accept(code, frame)`` says) and logs entries and returns.

    Each accepted entry gets a unique integer as its entry data, so the return can be paired
    with its entry exactly. ``log`` is shared by several recorders to see the global order.
    """

    def __init__(self, filter="", notrace="", accept=None, log=None, name=None, **kw):
        super().__init__(filter=filter, notrace=notrace, name=name, **kw)
        self.accept = accept
        self.log = log if log is not None else []
        self.entries: dict[int, tuple] = {}  # data -> (name, depth, thread)
        self.returns: list[tuple] = []  # (data, name, retval, exc, flags, sleep, t0, t1)
        self.lock = threading.Lock()

    def entryfunc(self, code, frame, depth, t):
        if self.accept is not None and not self.accept(code, frame):
            return None
        data = next(_ids)
        with self.lock:
            self.entries[data] = (code.co_name, depth, threading.get_ident())
            self.log.append((self.name, "enter", code.co_name, data))
        return data

    def retfunc(self, code, frame, depth, data, retval, exc, t0, t1, sleep, flags):
        with self.lock:
            self.returns.append((data, code.co_name, retval, exc, flags, sleep, t0, t1))
            self.log.append((self.name, "return", code.co_name, data))

    # --- checks shared by many tests ---
    def returned(self):
        return [r[0] for r in self.returns]

    def assert_exactly_once(self):
        got = self.returned()
        assert len(got) == len(set(got)), "a return was delivered twice"
        assert set(got) == set(self.entries), (
            f"entries without return: {set(self.entries) - set(got)}; "
            f"returns without entry: {set(got) - set(self.entries)}")

    def names(self, kind="enter"):
        return [e[2] for e in self.log if e[0] == self.name and e[1] == kind]
