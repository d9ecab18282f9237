"""The program of docs/cli.md's examples: parses stock rows, and computes a Fibonacci number.

``python prog.py [--its-flag]``.
"""

import sys


class Stock:
    def __init__(self, name, price):
        self.name = name
        self.price = price


def parse_price(text):
    return float(text)  # raises ValueError for a bad price


def parse_row(row):
    name, price = row.split(",")
    return Stock(name, parse_price(price))


def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)


def main():
    stocks = []
    for row in ["ACME,12.5", "INIT,n/a", "WIDG,3"]:
        try:
            stocks.append(parse_row(row))
        except ValueError:
            print("skipped", row)
    print(len(stocks), "stocks;", "fib(10) =", fib(10), "; flags:", sys.argv[1:])


main()
