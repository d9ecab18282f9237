"""Parses JSON of growing sizes, and one bad document (for probe events from the CLI)."""

import json


def parse(text, strict=True):
    return json.loads(text)


for n in range(1, 50):
    parse("[" + ",".join(["1"] * n) + "]")
try:
    parse("{bad")
except ValueError:
    pass
