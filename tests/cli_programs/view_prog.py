"""Threads, each running its own asyncio loop: the program ``rethook view`` is tested on.

Every thread crawls a few pages: tasks gathered, each awaiting two fetches (awaits that
suspend), then parsing the page and scoring it with a recursive function. The program counts
its own calls of ``score`` per thread and prints them, for the test to compare with the trace.
"""

import asyncio
import threading
from collections import Counter

SCORED: Counter[str] = Counter()


def score(n):
    SCORED[threading.current_thread().name] += 1
    return n if n < 2 else score(n - 1) + score(n - 2)


def parse(page):
    return len(page)


async def fetch(url, copies):
    await asyncio.sleep(0)
    return url * copies


async def visit(i):
    page = await fetch(f"/p{i}", i % 3 + 1)
    page += await fetch(f"/q{i}", i % 3 + 1)
    return score(parse(page) % 7)


async def crawl(n):
    return sum(await asyncio.gather(*(visit(i) for i in range(n))))


def worker(n):
    asyncio.run(crawl(n))


def main():
    threads = [threading.Thread(target=worker, args=(n,), name=f"crawler-{n}") for n in (3, 5)]
    for t in threads:
        t.start()
    worker(4)
    for t in threads:
        t.join()
    for name, calls in sorted(SCORED.items()):
        print(f"{name} {calls}")


main()
