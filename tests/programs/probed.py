"""Functions the probe-event tests attach to."""

import asyncio


class Session:
    def __init__(self, host):
        self.host = host
        self.sent = 0

    def send(self, path, size):
        self.sent += 1
        path = "changed"  # noqa: F841 - the probe must still see the argument as passed
        return 200 if size < 100 else 413


def lookup(table, key):
    return table[key]


def countdown(n):
    while n:
        yield n
        n -= 1
    return "liftoff"


async def fetch(delay, value):
    await asyncio.sleep(delay)
    return value * 2


async def fetch_all():
    return await asyncio.gather(fetch(0, 1), fetch(0.001, 2))


def sizes(data):
    return len(data)
