"""The benchmark workloads: (a) a call storm, (b) mixed object-oriented code, (c) sparse.

Each ``run_*`` function returns a checksum so the work cannot be skipped, and each workload
exposes the names a probe or filter should target.
"""

from __future__ import annotations


# --- (a) call-heavy: ~15 M tiny calls -------------------------------------------------------
def fib(n: int) -> int:
    return n if n < 2 else fib(n - 1) + fib(n - 2)


def run_calls(n: int = 33) -> int:
    """fib(33) makes 11.4 M calls; fib(34) 18.5 M."""
    return fib(n)


def fib_calls(n: int) -> int:
    a, b = 1, 1
    for _ in range(n - 1):
        a, b = b, a + b + 1
    return b if n else 1


def run_generators(n: int = 200_000) -> int:
    """n generator expressions run to their end: each is 8 function_graph events (entry, 3
    suspends, 3 resumes, exit)."""
    hits = 0
    for _ in range(n):
        hits += any(x > 5 for x in (1, 2, 3))
    return hits


GENERATOR_EVENTS = 8  # per run_generators round


# --- (b) mixed object-oriented --------------------------------------------------------------
class Account:
    __slots__ = ("owner", "balance", "history")

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.balance = 0
        self.history: list[int] = []

    def deposit(self, amount: int) -> None:
        if amount <= 0:
            raise ValueError("amount must be positive")
        self.balance += amount
        self.history.append(amount)

    def withdraw(self, amount: int) -> bool:
        if amount > self.balance:
            return False
        self.balance -= amount
        self.history.append(-amount)
        return True

    @property
    def activity(self) -> int:
        return sum(abs(x) for x in self.history)


class Bank:
    def __init__(self, n: int) -> None:
        self.accounts = {f"user{i}": Account(f"user{i}") for i in range(n)}

    def transfer(self, src: str, dst: str, amount: int) -> bool:
        a, b = self.accounts[src], self.accounts[dst]
        if amount > 0 and a.withdraw(amount):
            b.deposit(amount)
            return True
        return False

    def audit(self) -> int:
        return sum(acc.activity for acc in self.accounts.values())


def _amounts(seed: int, n: int):
    x = seed
    for _ in range(n):
        x = (x * 1103515245 + 12345) & 0x7FFFFFFF
        yield x % 100


def run_mixed(rounds: int = 40, size: int = 50) -> int:
    total = 0
    for r in range(rounds):
        bank = Bank(size)
        for i, amount in enumerate(_amounts(r, size * 4)):
            name = f"user{i % size}"
            try:
                bank.accounts[name].deposit(amount)
            except ValueError:
                total += 1
        for i, amount in enumerate(_amounts(r + 1, size * 20)):
            bank.transfer(f"user{i % size}", f"user{(i * 7) % size}", amount)
        total += bank.audit() + len(sorted(bank.accounts, key=lambda k: bank.accounts[k].balance))
    return total


# --- (c) sparse: a target called ~1000 times among millions of untraced calls ----------------
def target(key: str, values: list[int]) -> int:
    return sum(values) + len(key)


def _noise(n: int) -> int:
    return n + 1


def run_sparse(outer: int = 1000, inner: int = 3000) -> int:
    total = 0
    for i in range(outer):
        for j in range(inner):
            total = _noise(total) if j & 1 else total + j
        total += target(f"k{i}", [i, i + 1, i + 2])
    return total
