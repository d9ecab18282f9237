"""A script with no functions of its own."""

print(sum(range(10)))
