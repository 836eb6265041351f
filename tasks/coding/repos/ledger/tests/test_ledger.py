import pytest
from ledger import Entry, InsufficientFunds, Ledger, LedgerError


def make():
    ledger = Ledger()
    ledger.open_account("alice")
    ledger.open_account("bob", overdraft=500)
    return ledger


def test_new_accounts_are_empty():
    ledger = make()
    assert ledger.balance("alice") == 0
    assert ledger.balance("bob") == 0
    assert ledger.total() == 0


def test_duplicate_and_unknown_accounts():
    ledger = make()
    with pytest.raises(LedgerError):
        ledger.open_account("alice")
    with pytest.raises(LedgerError):
        ledger.balance("carol")
    with pytest.raises(LedgerError):
        ledger.open_account("carol", overdraft=-1)


def test_deposit():
    ledger = make()
    assert ledger.deposit("alice", 1000) == 1000
    assert ledger.deposit("alice", 250) == 1250
    assert ledger.balance("alice") == 1250


def test_amounts_must_be_positive_integers():
    ledger = make()
    for bad in (0, -5, 1.5, True, "10"):
        with pytest.raises(LedgerError):
            ledger.deposit("alice", bad)


def test_withdraw():
    ledger = make()
    ledger.deposit("alice", 1000)
    assert ledger.withdraw("alice", 300) == 700
    assert ledger.withdraw("alice", 700) == 0


def test_withdraw_more_than_balance_fails():
    ledger = make()
    ledger.deposit("alice", 100)
    with pytest.raises(InsufficientFunds):
        ledger.withdraw("alice", 101)
    assert ledger.balance("alice") == 100


def test_overdraft_limit():
    ledger = make()
    assert ledger.available("bob") == 500
    assert ledger.withdraw("bob", 500) == -500
    assert ledger.available("bob") == 0
    with pytest.raises(InsufficientFunds):
        ledger.withdraw("bob", 1)


def test_transfer():
    ledger = make()
    ledger.deposit("alice", 1000)
    ledger.transfer("alice", "bob", 400)
    assert ledger.balance("alice") == 600
    assert ledger.balance("bob") == 400
    assert ledger.total() == 1000


def test_transfer_can_use_overdraft():
    ledger = make()
    ledger.transfer("bob", "alice", 200)
    assert ledger.balance("bob") == -200
    assert ledger.balance("alice") == 200


def test_failed_transfer_changes_nothing():
    ledger = make()
    ledger.deposit("alice", 100)
    with pytest.raises(InsufficientFunds):
        ledger.transfer("alice", "bob", 150)
    with pytest.raises(LedgerError):
        ledger.transfer("alice", "alice", 10)
    with pytest.raises(LedgerError):
        ledger.transfer("alice", "nobody", 10)
    assert ledger.balance("alice") == 100
    assert ledger.balance("bob") == 0
    assert len(ledger.entries) == 1


def test_statement_records_balances():
    ledger = make()
    ledger.deposit("alice", 1000)
    ledger.withdraw("alice", 200)
    ledger.transfer("alice", "bob", 300)
    assert ledger.statement("alice") == [
        Entry("alice", "deposit", 1000, 1000),
        Entry("alice", "withdrawal", 200, 800),
        Entry("alice", "transfer_out", 300, 500),
    ]
    assert ledger.statement("bob") == [Entry("bob", "transfer_in", 300, 300)]


def test_insufficient_funds_is_a_ledger_error():
    assert issubclass(InsufficientFunds, LedgerError)
