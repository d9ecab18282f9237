def step(i):
    return i * 2


def total(n):
    return sum(step(i) for i in range(n))
