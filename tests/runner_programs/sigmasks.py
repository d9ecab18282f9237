"""Prints, for each thread of this process but the main one, whether it blocks SIGTERM and
SIGINT (from /proc: the threads are rethook's own, which the program cannot list)."""

import os
import signal

main = os.getpid()
for tid in sorted(int(t) for t in os.listdir("/proc/self/task")):
    if tid == main:
        continue
    with open(f"/proc/self/task/{tid}/status") as f:
        blocked = int(next(line for line in f if line.startswith("SigBlk:")).split()[1], 16)
    print(all(blocked & (1 << (sig - 1)) for sig in (signal.SIGTERM, signal.SIGINT)))
