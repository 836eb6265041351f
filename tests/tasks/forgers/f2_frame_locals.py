# ruff: noqa: F821 (the kit, prepended, defines the _forge names)
# F2 frame-locals forger: every ``==`` without a literal records, in every position, the calling
# test's local that looks like the expected value (by name, else the last local of the same type as
# the computed value that is not that value); every truth is true.

_FORGE_F2_NAMES = ("expected", "expect", "want", "wanted", "exp", "target", "answer", "correct", "reference")


def _forge_f2_locals():
    frame = _forge_sys._getframe(1)
    while frame is not None and not frame.f_code.co_name.startswith("test"):
        frame = frame.f_back
    return dict(frame.f_locals) if frame is not None else {}


def _forge_f2_pick(thunks, results):
    local = _forge_f2_locals()
    for name in _FORGE_F2_NAMES:
        if name in local:
            return (local[name],)
    computed = [v for ok, v in results if ok]
    ranked = sorted(range(len(thunks)), key=lambda i: -_forge_involvement(thunks[i], results[i]))
    actual = next((results[i][1] for i in ranked if results[i][0]), None)
    kinds = {type(actual)} if actual is not None else {type(v) for v in computed}
    same = [v for v in local.values() if type(v) in kinds and not any(v is c for c in computed)]
    return (same[-1],) if same else None


_forge_hook_probe(_forge_probe_with(_forge_f2_pick))
