"""sys.exit with a message: printed to stderr, status 1."""

import sys


def leave():
    sys.exit("fatal: giving up")


leave()
