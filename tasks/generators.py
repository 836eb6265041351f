"""The built-in suites by name: one place that the job config (``generate: KIND``) and
``pqrl tasks generate KIND`` both build them from, so the two cannot disagree."""

from __future__ import annotations

from dataclasses import dataclass

from tasks.suite import Suite

__all__ = ["GENERATED", "Generate", "check", "generate_suite"]

# the kinds a config or the CLI may name, and the environment each kind's suite runs in
GENERATED = {"calc": "calc-v1", "data": "data-v1", "search": "search-v1", "coding": "coding-v1"}


@dataclass(frozen=True)
class Generate:
    """What to build. ``shots`` applies to every kind, ``format_reward`` to calc, data and search,
    ``level`` to calc and data; ``n`` and ``seed`` to every kind but coding (its 66 tasks are
    shipped)."""

    kind: str
    n: int = 256
    seed: int = 0
    name: str | None = None
    shots: int | None = None
    level: int | None = None
    format_reward: float = 0.0


def check(g: Generate) -> None:
    """Raises ValueError for a kind that does not exist or an option the kind does not take."""
    if g.kind not in GENERATED:
        raise ValueError(f"no built-in suite {g.kind!r}; known: {', '.join(GENERATED)}")
    if g.kind in ("search", "coding") and g.level is not None:
        raise ValueError(f"{g.kind}: level applies to calc and data only")
    if g.kind == "coding" and g.format_reward:
        raise ValueError("coding: format_reward applies to calc, data and search")


def generate_suite(g: Generate) -> Suite:
    check(g)
    if g.kind == "coding":
        from tasks.coding.env import MAX_SHOTS, builtin_suite

        shipped = builtin_suite()
        if not g.shots:
            return shipped
        if g.shots > MAX_SHOTS:
            raise ValueError(f"coding: shots must be 0 to {MAX_SHOTS}, got {g.shots}")
        manifest = shipped.manifest.model_copy(
            update={"defaults": {**shipped.manifest.defaults, "shots": g.shots}}
        )
        return Suite(manifest, shipped.tasks)
    if g.kind == "search":
        from tasks.search import search_suite

        return search_suite(g.n, g.seed, name=g.name or f"search-s{g.seed}", shots=g.shots or 0,
                            format_reward=g.format_reward)  # fmt: skip
    level = 2 if g.level is None and g.kind == "calc" else (g.level or 1)
    name = g.name or f"{g.kind}{level}-s{g.seed}"
    kwargs = {"level": level, "format_reward": g.format_reward, "name": name}
    if g.kind == "data":
        from tasks.data import data_suite

        return data_suite(g.n, g.seed, shots=2 if g.shots is None else g.shots, **kwargs)
    from tasks.calc import calc_suite

    return calc_suite(g.n, g.seed, shots=1 if g.shots is None else g.shots, **kwargs)
