"""A deterministic program for the record -> report golden tests (one thread)."""

import helper


def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)


class Counter:
    def __init__(self):
        self.n = 0

    def bump(self, by):
        self.n += by
        return self.n

    @property
    def double(self):
        return self.n * 2


def fail(n):
    if n == 0:
        raise ValueError("zero")
    return fail(n - 1)


def safe():
    try:
        fail(1)
    except ValueError:
        return "caught"


def main():
    c = Counter()
    c.bump(2)
    print(fib(3), c.double, safe(), helper.twice(4))


main()
