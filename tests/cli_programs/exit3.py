"""Exits with status 3 from inside a function."""

import sys


def leave():
    print("leaving with 3")
    sys.exit(3)


leave()
