"""A program that spends its time in the standard library (for the cProfile comparison)."""

import collections
import dataclasses
import difflib
import fractions
import json
import re
import statistics
import textwrap


@dataclasses.dataclass
class Item:
    name: str
    qty: int

    def total(self, price):
        return self.qty * price


def words(text):
    yield from re.findall(r"[a-z]+", text.lower())


def main():
    text = textwrap.dedent("""
        The quick brown fox jumps over the lazy dog. The dog sleeps;
        the fox runs away, quick as ever, over hills and over dales.
    """) * 5
    counts = collections.Counter(words(text))
    items = [Item(w, n) for w, n in counts.most_common(8)]
    blob = json.dumps([dataclasses.asdict(i) for i in items], indent=1, sort_keys=True)
    back = json.loads(blob)
    ratio = difflib.SequenceMatcher(None, text[:200], text[100:300]).ratio()
    mean = statistics.mean(i.total(fractions.Fraction(3, 2)) for i in items)
    wrapped = textwrap.fill(" ".join(w["name"] for w in back), width=20)
    return len(wrapped), round(ratio, 3), mean
