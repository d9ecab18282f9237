"""A package run with ``-m clipkg`` (its __main__) and ``-m clipkg.tool``."""


def version():
    return "1.0"
