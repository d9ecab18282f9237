"""Generators: one consumed fully, one closed early, one delegating with yield from."""


def count(n):
    for i in range(n):  # noqa: UP028 - one resumption per value, on purpose
        yield i


def evens(n):
    for i in count(n):
        if i % 2 == 0:
            yield i


def chain(n):
    yield from count(n)
    yield from evens(n)


def main():
    print(list(chain(4)))
    g = count(10)
    print(next(g), next(g))
    g.close()


main()
