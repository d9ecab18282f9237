"""``python -m clipkg``."""

import sys

from clipkg import version


def main():
    print("clipkg", version(), sys.argv[1:])


main()
