"""Prints what a script sees of how it was started."""

import os
import sys
import threading

print("argv:", sys.argv)
print("name:", __name__)
print("file:", __file__)
print("spec:", __spec__)
print("package:", __package__)
print("path0 is script dir:", sys.path[0] == os.path.dirname(os.path.realpath(__file__)))
print("main module:", sys.modules["__main__"].__dict__ is globals())
print("threads:", threading.active_count())
