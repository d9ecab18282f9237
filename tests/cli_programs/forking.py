"""Forks: the child reports and exits with a status, the parent waits for it. Traced, the
parent's trace file must stay intact, and stderr must match a plain run (no warning about
forking a multi-threaded process: the recorder's thread is paused around the fork)."""

import os
import sys


def child():
    print("child running", flush=True)
    return 7


def parent(pid):
    _, status = os.waitpid(pid, 0)
    print("child exited with", os.waitstatus_to_exitcode(status))


pid = os.fork()
if pid == 0:
    sys.exit(child())
parent(pid)
