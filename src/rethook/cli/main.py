"""The ``rethook`` command line (placeholder until the CLI lands)."""

import sys


def main() -> None:
    print("rethook: command line not built yet", file=sys.stderr)
    sys.exit(2)
