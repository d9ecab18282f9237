"""Known call counts for the profiler: fib(10) is 177 calls, step() 5, the generator 4
resumptions for 3 values (cProfile counts each resumption)."""


def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)


def step(i):
    return i + 1


def gen():
    yield 1
    yield 2
    yield 3


def main():
    total = fib(10)
    for i in range(5):
        total += step(i)
    total += sum(gen())
    print(total)


main()
