"""Expected operands held on the host, for asserts that compute their expected value themselves.

``assert add(a, b) == Matrix([[6, 8], [10, 12]])`` has no literal for the host to keep back, and
whatever the container computes, code that takes over the test process can read: it could record
the expected operand's value as the actual one and pass. So the expected operand must not be
computed in the submission's container at all. Which operand is the expected one, the source does
not say (``result == expected``, ``expected == result``); running the code does:

- the reference runs the fully rewritten tests on the unfixed repository (the *base*) and on the
  gold solution; at a check where some operand's value differs between the two, the fix changes
  that operand: it is the code's answer and stays in the container;
- an operand the fix leaves unchanged, whose expression has no effect (a name, a constructor call
  on literals, ...; ``probes.Site.pure``), is *held*: the rewritten test sent to a submission no
  longer evaluates it, and the host compares the remaining operands with the gold's values in
  the same position (``probes.compare``), so the check passes only with the correct answer.

Held only where that comparison is by content: every operand left in the container must encode
faithfully (no object recorded by its type alone) at every gold entry of the site, and only for
``==`` chains, not negated (a ``!=``, ``<`` or ``in`` check says less than "equal to the gold").
A check the base runs identically needs nothing held: the unfixed code passes it anyway.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from tasks.coding.probes import Site, compare, same, unstable_entries
from tasks.coding.record import Record, faithful

__all__ = [
    "Settled",
    "base_fails",
    "could_hold",
    "held_operands",
    "kept_values",
    "project",
    "settle",
]


def _raised(v: Any) -> bool:
    return isinstance(v, dict) and "!raised" in v


def _candidate(site: Site | None) -> bool:
    return (
        site is not None
        and site.kind == "compare"
        and not site.literals
        and not site.negated
        and set(site.ops) == {"=="}
        and bool(site.pure)
    )


def could_hold(sites: dict[int, Site]) -> bool:
    """Whether any site could have an operand held (else the base run has nothing to decide)."""
    return any(_candidate(site) for site in sites.values())


def _paired(gold: Record, base: Record) -> Iterator[tuple[str, int, int, list[Any], list[Any] | None]]:
    """Every gold entry as (test, index, site, values, the base's values at the same position).
    Entries pair while the two runs visit the same sites in the same order; from the first
    divergence on the base says nothing (None)."""
    for test, entries in gold.items():
        others = base.get(test, [])
        aligned = True
        for i, (site_id, values) in enumerate(entries):
            aligned = aligned and i < len(others) and others[i][0] == site_id
            yield test, i, site_id, values, others[i][1] if aligned else None


def held_operands(sites: dict[int, Site], gold: Record, base: Record) -> dict[int, tuple[int, ...]]:
    """Site -> the operands to hold on the host, from the gold record and the base record of the
    same fully rewritten tests, paired by position (``_paired``)."""
    changed: dict[int, set[int]] = defaultdict(set)
    unfit: set[int] = set()  # a gold entry not shaped as a passing comparison
    unfaithful: dict[int, set[int]] = defaultdict(set)  # operands not comparable by content
    paired: set[int] = set()
    for _, _, site_id, values, b in _paired(gold, base):
        site = sites.get(site_id)
        if not _candidate(site):
            continue
        assert site is not None
        n = len(site.ops) + 1
        if len(values) != n + 1 or any(_raised(v) for v in values):
            unfit.add(site_id)
            continue
        unfaithful[site_id] |= {j for j in range(n) if not faithful(values[j])}
        if b is not None:
            paired.add(site_id)
            differ = {j for j in range(min(n, len(b))) if _raised(b[j]) or not same(b[j], values[j])}
            changed[site_id] |= differ
    out: dict[int, tuple[int, ...]] = {}
    for site_id in paired - unfit:
        site = sites[site_id]
        held = tuple(j for j in site.pure if j not in changed[site_id])
        kept = set(range(len(site.ops) + 1)) - set(held)
        if held and kept & changed[site_id] and not kept & unfaithful[site_id]:
            out[site_id] = held
    return out


def base_fails(gold: Record, base: Record) -> frozenset[tuple[str, int]]:
    """The gold entries (test, index) the unfixed code reached and recorded differently, paired by
    position (``_paired``): the checks a submission that leaves the bug in place must forge. A
    check the unfixed code never reached (it raised, stopped or went another way first) is no
    evidence: the bug may not change its value at all."""
    pairs = _paired(gold, base)
    return frozenset((test, i) for test, i, _, values, b in pairs if b is not None and not same(b, values))


def kept_values(site: Site | None, values: list[Any]) -> list[Any]:
    """A full entry reduced to what a submission records at ``site``: its kept operands."""
    if site is None or not site.held:
        return values
    n = len(site.ops) + 1
    return [values[i] for i in range(min(n, len(values))) if i not in site.held]


def project(record: Record, sites: dict[int, Site]) -> Record:
    """A record of the fully rewritten tests, as the tests rewritten with ``sites``' held
    operands would have recorded it."""
    return {test: [(s, kept_values(sites.get(s), v)) for s, v in entries] for test, entries in record.items()}


@dataclass(frozen=True)
class Settled:
    """What two gold runs say: the operands held for good, and what varies between runs."""

    held: dict[int, tuple[int, ...]]
    unstable: set[tuple[str, int]]
    unstable_tests: set[str]


def settle(sites: dict[int, Site], first: Record, second: Record, tests: list[str]) -> Settled | None:
    """``first``: the gold record of the fully rewritten tests; ``second``: the gold record of the
    tests rewritten with ``sites`` (some operands held). Entries whose values differ between the
    two vary from run to run: a held site with such an entry is held no more (its varying value
    cannot be compared by position; the container's truth judges it, as before). None when the
    second run fails a check that does not vary: leaving an operand out changed what the code does."""
    unstable, unstable_tests = unstable_entries(project(first, sites), second)
    at_held = {(t, i) for t, i in unstable if getattr(sites.get(second[t][i][0]), "held", ())}
    judged = [t for t in tests if t not in unstable_tests]
    if compare(first, second, sites, judged, unstable, skip=at_held):
        return None
    dropped = {second[t][i][0] for t, i in at_held}
    held = {s: site.held for s, site in sites.items() if site.held and s not in dropped}
    return Settled(held, unstable, unstable_tests)
