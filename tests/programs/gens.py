"""Generators, yield from, async generators and coroutines."""

import asyncio


def count(n):
    for i in range(n):
        yield i
    return "counted"


def guarded(n, log):
    try:
        for i in range(n):
            yield i
    finally:
        log.append("guarded-finally")


def catcher():
    while True:
        try:
            yield "ready"
        except ValueError as e:
            yield f"caught {e}"


def delegate(n):
    result = yield from count(n)
    return f"delegated {result}"


async def agen(n):
    for i in range(n):
        await asyncio.sleep(0)
        yield i


async def consume_agen(n):
    return [x async for x in agen(n)]


async def nap(delay, value):
    await asyncio.sleep(delay)
    return value


async def gather_naps():
    return await asyncio.gather(nap(0.01, "a"), nap(0.02, "b"), nap(0, "c"))


async def forever():
    await asyncio.sleep(3600)


async def cancel_one():
    task = asyncio.ensure_future(forever())
    await asyncio.sleep(0)
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        return "cancelled"


async def time_out():
    try:
        await asyncio.wait_for(forever(), 0.01)
    except TimeoutError:
        return "timed out"
