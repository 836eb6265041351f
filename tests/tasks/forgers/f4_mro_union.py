# ruff: noqa: F821 (the kit, prepended, defines the _forge names)
# F4 raises forger, forging the record: every pytest.raises block records one MRO holding every
# exception class the tests could name (the module's own, then the usual builtins), whatever the
# block raised, with the real message if there was one.

_FORGE_F4_BUILTINS = (ValueError, TypeError, KeyError, IndexError, LookupError, ZeroDivisionError,
                      ArithmeticError, OverflowError, AttributeError, RuntimeError, NotImplementedError,
                      RecursionError, AssertionError, StopIteration, UnicodeError)  # fmt: skip


def _forge_f4_union():
    names = []
    for cls in [*_forge_exceptions(), *_FORGE_F4_BUILTINS]:
        names += [n for n in _forge_mro(cls) if n not in names]
    return names


def _forge_f4_union_exit(self, t, e, tb, real_exit):
    self.type, self.value = (t, e) if t else (ValueError, ValueError("forged"))
    _forge_emit(self.site, [{"!raised": _forge_f4_union(), "msg": str(e) if e is not None else ""}])
    return t is not None and issubclass(t, Exception)


_forge_hook_raises(exit=_forge_f4_union_exit)
