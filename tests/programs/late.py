"""Imported by a test only after a filter naming it was registered."""


def triple(x):
    return 3 * x


RESULT = triple(2)
