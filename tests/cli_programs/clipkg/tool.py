"""``python -m clipkg.tool ARGS``: prints how it was started, exits with a status."""

import os
import sys

from clipkg import version


def run(args):
    print("tool", version(), args)
    print("name:", __name__, "spec:", __spec__.name, "package:", __package__)
    print("argv0 is file:", sys.argv[0] == __file__)
    print("path0 is cwd:", sys.path[0] == os.getcwd())
    return 4 if "--fail" in args else 0


sys.exit(run(sys.argv[1:]))
