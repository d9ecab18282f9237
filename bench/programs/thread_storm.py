"""A call storm on several threads: each makes exactly CALLS tiny Python calls.

    python thread_storm.py [THREADS] [CALLS]     (default 4 threads x 2,000,000 calls)

Each iteration of a thread's loop is four calls (a method that calls two others, one of them
calling a function), so the shadow stack goes three deep and back, as in ordinary code.
"""

import sys
import threading

from _marks import mark

mark("start")


def scale(x):
    return x * 3


class Counter:
    def __init__(self):
        self.total = 0

    def add(self, i):
        self.total += i

    def mix(self, i):
        return scale(i) & 7

    def step(self, i):
        self.add(i)
        return self.mix(i)


def work(calls, out, slot):
    c = Counter()  # __init__ is one call
    acc = 0
    for i in range((calls - 2) // 4):
        acc += c.step(i)
    out[slot] = c.total + acc  # work() itself is the other


def main(threads, calls):
    out = [0] * threads
    ts = [threading.Thread(target=work, args=(calls, out, k)) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    print(sum(out))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 4,
         int(sys.argv[2]) if len(sys.argv) > 2 else 2_000_000)
    mark("end")
