"""A module of the program's own directory: traced by default, like the script."""


def inc(x):
    return x + 1


def twice(x):
    return inc(x) + inc(x)
