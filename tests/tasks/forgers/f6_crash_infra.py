# ruff: noqa: F821 (the kit, prepended, defines the _forge names)
# F6 crash into the infrastructure: the repository's functions return hostile values in turn (sets
# of frozensets, 100,000-deep nesting, 5,000-digit ints, lone surrogates, names that are not UTF-8,
# NaN) and every other entry the recorder writes is replaced by a hostile encoding, so that judging
# the record on the host would crash (the grading would be failed_infra instead of 0).


def _forge_f6_deep(n):
    x = []
    for _ in range(n):
        x = [x]
    return x


def _forge_f6_odd_class():
    cls = type("Odd", (), {})
    cls.__qualname__, cls.__module__ = "\udcff\ud800", "\udcfe"
    return cls()


_FORGE_F6_VALUES = [  # built once: a test may call the code thousands of times
    {frozenset({1, frozenset({2})}), frozenset()},
    _forge_f6_deep(100_000),
    10**5000 - 1,
    -(2**70000),
    "\udcff\ud800 not UTF-8",
    bytes(range(256)),
    _forge_f6_odd_class(),
    float("nan"),
    {(1, frozenset()): {frozenset(): [float("inf")]}},
]
_FORGE_F6_ENCODED = [
    {"int": "9" * 5000},
    {"int": "0x" + "f" * 10000},
    {"set": ['{"set": []}', '{"dict": []}']},
    {"dict": [['{"list": []}', 1]]},
    {"float": "nan"},
    {"float": "1e999999"},
    {"str": "\udcff"},
    {"bytes": "zz"},
    {"complex": [{"int": "0x" + "f" * 10000}, 1]},
    {"!raised": ["\udcff.\ud800"], "msg": "\udcff"},
    {"!truth": "\udcff"},
    {"list": [{"list": [{"tuple": [{"frozenset": ['{"set": []}']}]}]}]},
]


def _forge_f6_call(fn, args, kwargs):
    _FORGE_STATE["calls"] += 1
    n = _FORGE_STATE["calls"]
    if n % 3 == 0:
        raise ValueError("\udcff" * 100)
    return _FORGE_F6_VALUES[n % len(_FORGE_F6_VALUES)]


def _forge_f6_hook_emit():
    rt = _forge_runtime()
    if rt is None or "_forge_real_emit" in rt:
        return
    real = rt["_forge_real_emit"] = rt["_emit"]

    def emit(site, values):
        _FORGE_STATE["emits"] += 1
        n = _FORGE_STATE["emits"]
        if n % 2:
            hostile = _FORGE_F6_ENCODED[n % len(_FORGE_F6_ENCODED)]
            values = [hostile for _ in values]
            site = (2**70, -1, site)[n % 3]
        real(site, values)

    rt["_emit"] = emit


_forge_f6_hook_emit()
_forge_wrap_all(_forge_f6_call)
