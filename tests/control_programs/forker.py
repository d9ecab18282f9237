"""Forks two children that call tick() until the parent says stop (a line on its stdin)."""

import os
import select
import sys
import threading


def tick(i):
    return i + 1


print("threads", threading.active_count(), flush=True)
r, w = os.pipe()
children = []
for _ in range(2):
    pid = os.fork()
    if pid == 0:
        os.close(w)
        i = 0
        while not select.select([r], [], [], 0.002)[0]:
            tick(i)
            i += 1
        os._exit(0)
    children.append(pid)
os.close(r)
print("forked", len(children), flush=True)
sys.stdin.readline()
os.close(w)
print("exits", [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children])
