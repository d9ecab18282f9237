"""Threads: a worker per item, a thread pool, and a non-daemon thread still running at the end
of the script (Python waits for it, and so must the tracer), plus an atexit handler."""

import atexit
import concurrent.futures
import threading
import time


def square(x):
    return x * x


def worker(x, out, lock):
    with lock:
        out.append(square(x))


def late():
    time.sleep(0.05)
    print("late thread done")


def goodbye():
    print("atexit handler ran")


def main():
    out, lock = [], threading.Lock()
    threads = [threading.Thread(target=worker, args=(i, out, lock)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print("squares:", sorted(out))
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        print("pool:", sorted(pool.map(square, range(5))))
    atexit.register(goodbye)
    threading.Thread(target=late).start()
    print("main done")


main()
