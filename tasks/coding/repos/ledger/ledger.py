"""A bank ledger in integer cents: accounts, deposits, withdrawals with overdraft limits, transfers."""

from dataclasses import dataclass


class LedgerError(Exception):
    pass


class InsufficientFunds(LedgerError):
    pass


@dataclass(frozen=True)
class Entry:
    account: str
    kind: str  # "deposit", "withdrawal", "transfer_in" or "transfer_out"
    amount: int
    balance: int  # the account's balance after this entry


class Ledger:
    def __init__(self) -> None:
        self._balances: dict[str, int] = {}
        self._overdraft: dict[str, int] = {}
        self.entries: list[Entry] = []

    def open_account(self, name: str, overdraft: int = 0) -> None:
        if name in self._balances:
            raise LedgerError(f"account {name!r} already exists")
        if overdraft < 0:
            raise LedgerError("overdraft limit must be >= 0")
        self._balances[name] = 0
        self._overdraft[name] = overdraft

    def balance(self, name: str) -> int:
        self._check(name)
        return self._balances[name]

    def available(self, name: str) -> int:
        """What can be withdrawn now: the balance plus the overdraft limit."""
        return self.balance(name) + self._overdraft[name]

    def deposit(self, name: str, amount: int) -> int:
        self._check(name)
        self._check_amount(amount)
        self._balances[name] += amount
        self._record(name, "deposit", amount)
        return self._balances[name]

    def withdraw(self, name: str, amount: int) -> int:
        self._check(name)
        self._check_amount(amount)
        if amount > self.available(name):
            raise InsufficientFunds(f"{name} can withdraw at most {self.available(name)}")
        self._balances[name] -= amount
        self._record(name, "withdrawal", amount)
        return self._balances[name]

    def transfer(self, source: str, target: str, amount: int) -> None:
        """Moves ``amount`` from ``source`` to ``target``; nothing changes when it fails."""
        self._check(source)
        self._check(target)
        if source == target:
            raise LedgerError("cannot transfer to the same account")
        self._check_amount(amount)
        if amount > self.available(source):
            raise InsufficientFunds(f"{source} can transfer at most {self.available(source)}")
        self._balances[source] -= amount
        self._balances[target] += amount
        self._record(source, "transfer_out", amount)
        self._record(target, "transfer_in", amount)

    def statement(self, name: str) -> list[Entry]:
        self._check(name)
        return [e for e in self.entries if e.account == name]

    def total(self) -> int:
        """The sum of all balances (transfers do not change it)."""
        return sum(self._balances.values())

    def _check(self, name: str) -> None:
        if name not in self._balances:
            raise LedgerError(f"no account {name!r}")

    def _check_amount(self, amount: int) -> None:
        if isinstance(amount, bool) or not isinstance(amount, int) or amount <= 0:
            raise LedgerError(f"amount must be a positive number of cents, got {amount!r}")

    def _record(self, name: str, kind: str, amount: int) -> None:
        self.entries.append(Entry(name, kind, amount, self._balances[name]))
