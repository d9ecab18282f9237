"""Imported only after a probe naming it was created."""


def double(x):
    return 2 * x


FIRST = double(21)
