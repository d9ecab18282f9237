"""Work in every kind of child process; prints how many times ``work`` ran in total, and each
process of a three-level subprocess tree prints how many times it called ``leaf``."""

import concurrent.futures
import multiprocessing
import os
import subprocess
import sys


def work(x):
    return x * x


def leaf(i):
    return i + 1


def tree(level):
    calls = level + 2
    for i in range(calls):
        leaf(i)
    print(f"leaf {os.getpid()} {calls}", flush=True)
    if level < 3:
        out = subprocess.run([sys.executable, __file__, "tree", str(level + 1)],
                             capture_output=True, text=True, check=True)
        print(out.stdout, end="", flush=True)


def main():
    total = 0
    for method in ("fork", "spawn", "forkserver"):
        pool = multiprocessing.get_context(method).Pool(2)
        total += len(pool.map(work, range(6)))
        pool.close()  # (not the with block's terminate(): a worker still starting up when
        pool.join()   # the other one did all the work would be killed before it ran)
    with concurrent.futures.ProcessPoolExecutor(2) as ex:
        total += len(list(ex.map(work, range(4))))
    print("work", total, flush=True)
    tree(1)


if __name__ == "__main__":
    if sys.argv[1:2] == ["tree"]:
        tree(int(sys.argv[2]))
    else:
        main()
