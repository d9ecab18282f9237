"""rethook's demo: a tiny stock report, written to show what a function graph looks like.

It loads a few CSV rows (one is bad: the ValueError raised two calls down is caught by the
loader), values the stock through a class with a property, walks it in batches with a
generator, refreshes prices with asyncio tasks that await, checks a recursive reorder plan,
and audits the result in a second thread.

Run it as it is (``python demo.py``), or traced: ``rethook demo`` records it and prints the
graph; ``rethook record demo.py`` then ``rethook report`` does the same by hand.
"""

import asyncio
import threading

ROWS = ["apple,3,0.5", "pear,2,n/a", "plum,5,0.25"]


def parse_price(text):
    return float(text)  # "n/a" raises ValueError here...


def parse_row(row):
    name, qty, price = row.split(",")
    return name, int(qty), parse_price(price)


def load(rows):
    stock = Stock()
    for row in rows:
        try:
            stock.add(*parse_row(row))
        except ValueError:  # ...and it is caught here, two calls up
            stock.rejected += 1
    return stock


class Stock:
    def __init__(self):
        self.items = {}
        self.rejected = 0

    def add(self, name, qty, price):
        self.items[name] = [qty, price]

    @property
    def value(self):
        return round(sum([qty * price for qty, price in self.items.values()]), 2)

    def __repr__(self):
        return f"Stock({len(self.items)} items)"


def batches(names, size):
    for start in range(0, len(names), size):
        yield names[start:start + size]


async def fetch_price(name, delay):
    await asyncio.sleep(delay)
    return name, 0.1 * len(name)


async def refresh(stock):
    prices = await asyncio.gather(*[fetch_price(name, 0.001) for name in stock.items])
    for name, price in prices:
        stock.items[name][1] = round(price, 2)


def reorder(n):
    """Boxes to order for n items, in packs of 1 or 2 (a Fibonacci-like count of ways)."""
    return 1 if n < 2 else reorder(n - 1) + reorder(n - 2)


def audit(stock, out):
    out.append(f"audit: {len(stock.items)} items, {stock.rejected} rejected")


def main():
    stock = load(ROWS)
    print(f"stock value: {stock.value}")
    for batch in batches(sorted(stock.items), 1):
        print("batch:", ", ".join(batch))
    asyncio.run(refresh(stock))
    print(f"after refresh: {stock.value}")
    print(f"ways to pack 3: {reorder(3)}")
    notes = []
    worker = threading.Thread(target=audit, args=(stock, notes), name="auditor")
    worker.start()
    worker.join()
    print(*notes)


if __name__ == "__main__":
    main()
