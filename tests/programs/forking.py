"""A program that forks from inside traced calls (used by the fork test)."""

import os


def wait_in_thread(started, release):
    started.set()
    release.wait()


def fork_inside():
    """Fork while this call and ``outer_call`` are open."""
    return outer_call()


def outer_call():
    return os.fork()
