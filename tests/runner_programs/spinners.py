"""Three daemon threads that call a generator for as long as the process lives; the main
thread says ready once each has made its first thousand calls, then waits for a signal, or
returns with the threads still calling (``spinners.py return``)."""

import sys
import threading
import time


def count(n):
    yield from range(n)


def spin(started):
    for i in range(1_000_000_000):
        sum(count(20))
        if i == 1000:
            started.release()


started = threading.Semaphore(0)
for _ in range(3):
    threading.Thread(target=spin, args=(started,), daemon=True).start()
for _ in range(3):
    started.acquire()
print("ready", flush=True)
if sys.argv[1:] != ["return"]:
    time.sleep(600)
