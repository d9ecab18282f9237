"""Threads running asyncio loops, generators and recursion; every function counts its own
calls per thread and the counts go to the JSON file named by argv[1] at the end (for the
export tests: the recorded calls must be these)."""

import asyncio
import json
import sys
import threading
from collections import Counter

CALLS: Counter = Counter()
LOCK = threading.Lock()


def hit(name):
    with LOCK:
        CALLS[f"{threading.current_thread().name}|{name}"] += 1


def fib(n):
    hit("fib")
    return n if n < 2 else fib(n - 1) + fib(n - 2)


def squares(n):
    hit("squares")
    for i in range(n):
        yield i * i


def check(status):
    hit("check")
    return status


async def fetch(i):
    hit("fetch")
    await asyncio.sleep(0)
    return check(200 if i % 3 else 500)


async def crawl(n):
    hit("crawl")
    return await asyncio.gather(*(fetch(i) for i in range(n)))


def worker(n):
    hit("worker")
    fib(n)
    sum(squares(n))
    asyncio.run(crawl(n))


def main():
    hit("main")
    threads = [threading.Thread(target=worker, args=(5 + i,), name=f"worker-{i}")
               for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    worker(4)
    with open(sys.argv[1], "w") as f:
        json.dump(CALLS, f)


main()
