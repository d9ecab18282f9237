"""Says ready after its first calls, then calls ``spin`` until a signal ends it, or ends with
os._exit (``ending.py exit``)."""

import os
import sys
import time


def spin(i):
    return i + 1


def main():
    i = 0
    for _ in range(100):
        i = spin(i)
    print("ready", flush=True)
    if sys.argv[1:] == ["exit"]:
        sys.stdout.write("unflushed")  # os._exit drops it, traced or not
        os._exit(3)
    while True:
        i = spin(i)
        time.sleep(0.001)


main()
