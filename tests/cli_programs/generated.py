"""Calls of code made at run time: dataclass methods, a namedtuple's __new__, exec'd
functions (in a namespace of their own and in the script's), next to ordinary ones."""

import collections
import dataclasses


@dataclasses.dataclass(frozen=True)
class Point:
    x: int
    y: int = 0

    def norm(self):
        return abs(self.x) + abs(self.y)


Pair = collections.namedtuple("Pair", "left right")
NS = {}
exec("def scale(v, k):\n    return v * k\n", NS)
exec("def shift(v):\n    return v + 1\n", globals())


def main(n):
    total = 0
    seen = set()
    for i in range(n):
        p = Point(i, NS["scale"](i, 2))
        q = Pair(p, shift(i))  # noqa: F821 - defined by the exec above
        seen.add(p)
        total += p.norm() + q.right
        if p == Point(i, 2 * i):
            total += 1
        total += len(repr(p))
    print(total, len(seen))


main(40)
