"""A fork while another thread holds an object's lock (engine, registry): what the child finds."""

from __future__ import annotations

import os
import threading
import time
import warnings
from typing import Any


def fork_while_held(obj: Any) -> int:
    """Fork while a thread holds ``obj._lock`` (briefly); returns the child's wait status:
    0 when the child could take ``obj._lock``, not 0 when it was left locked."""
    held = threading.Event()

    def busy() -> None:
        with obj._lock:
            held.set()
            time.sleep(0.2)

    t = threading.Thread(target=busy)
    t.start()
    held.wait()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork with threads
        pid = os.fork()
    if pid == 0:
        os._exit(0 if obj._lock.acquire(timeout=5) else 1)
    t.join()
    return os.waitpid(pid, 0)[1]
