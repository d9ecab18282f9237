"""Threads that hand over to each other in the middle of their calls (events, not timing): each
call's entry is followed by the other threads' calls before its own next event."""

import sys
import threading

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 20


def leaf(i):
    return i + 1


def turn(i, me, following):
    """Waits for its turn (untraced: Event.wait), then hands over to the following thread."""
    me.wait()
    me.clear()
    value = leaf(i)
    following.set()
    return value


def worker(n, me, following):
    total = 0
    for i in range(ROUNDS):
        total += turn(i, me, following)
    return total


def main():
    events = [threading.Event() for _ in range(3)]
    threads = [threading.Thread(target=worker, args=(n, events[n], events[(n + 1) % 3]),
                                name=f"worker-{n}") for n in range(3)]
    for t in threads:
        t.start()
    events[0].set()
    for t in threads:
        t.join()
    print("done", ROUNDS)


main()
