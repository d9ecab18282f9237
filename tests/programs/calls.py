"""Plain calls: recursion, mutual recursion, exceptions caught at every level, finally."""


def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)


def is_even(n):
    return True if n == 0 else is_odd(n - 1)


def is_odd(n):
    return False if n == 0 else is_even(n - 1)


def deep(n):
    return 0 if n == 0 else 1 + deep(n - 1)


class Boom(Exception):
    pass


def raiser(n, at):
    if n == at:
        raise Boom(n)
    return raiser(n + 1, at)


def catch_at(level, at, seen):
    """Recurse to ``at`` and raise there; the frame at ``level`` catches it."""
    try:
        return _down(0, level, at, seen)
    except Boom:  # never reached: the catch happens inside
        raise AssertionError("escaped") from None


def _down(n, level, at, seen):
    if n == at:
        raise Boom(n)
    if n == level:
        try:
            return _down(n + 1, level, at, seen)
        except Boom as e:
            seen.append(e)
            return "caught"
    return _down(n + 1, level, at, seen)


def with_finally(log):
    try:
        return raiser(0, 2)
    finally:
        log.append("finally")


def leaf(x):
    return x * 2


def outer(x):
    return leaf(x) + leaf(x + 1)


class Shape:
    def __init__(self, side):
        self.side = side

    def area(self):
        return self.side * self.side

    @property
    def double(self):
        return self.area() * 2

    @staticmethod
    def unit():
        return Shape(1)

    @classmethod
    def make(cls, side):
        return cls(side)


def block(started, release):
    started.set()
    release.wait()
    return "released"
