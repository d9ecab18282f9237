"""A small long-running program for the control-channel tests: a thread calls tick() every
couple of milliseconds until a line arrives on stdin; then it says how it went."""

import sys
import threading
import time


def tock(i):
    return i * 2


def tick(i):
    return tock(i) + 1


def alpha():
    return 1


def beta():
    return 2


def gamma():
    return 3


def delta():
    return 4


stop = threading.Event()
count = [0]


def loop():
    i = 0
    while not stop.is_set():
        tick(i)
        i += 1
        count[0] = i
        time.sleep(0.002)


worker = threading.Thread(target=loop, name="ticker")
worker.start()
print("ready", threading.active_count(), sorted(t.name for t in threading.enumerate()),
      flush=True)
sys.stdin.readline()
stop.set()
worker.join()
print("ticked", count[0] > 0, threading.active_count())
