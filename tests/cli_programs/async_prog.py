"""asyncio: tasks gathered, each awaiting twice."""

import asyncio


async def step(name, i):
    await asyncio.sleep(0)
    return f"{name}{i}"


async def job(name):
    a = await step(name, 1)
    b = await step(name, 2)
    return a + b


async def main():
    print(await asyncio.gather(job("a"), job("b")))


asyncio.run(main())
