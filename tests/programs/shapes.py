"""A small program for exact tracer output: nesting, a leaf, an exception, a generator."""

import time


def leaf(x):
    return x + 1


def middle(x):
    return leaf(x) * 2


def top(x):
    total = middle(x)
    try:
        failing(x)
    except ValueError:
        total += 1
    return total + sum(numbers(2))


def failing(x):
    raise ValueError(x)


def numbers(n):
    for i in range(n):
        yield leaf(i)


def slow():
    time.sleep(0.02)
    return "slow"


def quick():
    return "quick"


def mixed():
    return [slow(), quick()]


def noisy():
    leaf(1)
    middle(2)
    return quick()
