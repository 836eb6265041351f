# ruff: noqa: F821 (the kit, prepended, defines the _forge names)
# F5 recorder trap: every value the repository's code returns becomes a liar: a subclass of its type
# whose class claims that type's module and name, whose __class__, __dict__, __int__, __index__ and
# __getattr__ lie, and which equals anything, so that the recorder would record something else.


def _forge_f5_liar(value):
    base = type(value)
    ns = {
        "__eq__": lambda s, o: True,
        "__ne__": lambda s, o: False,
        "__hash__": lambda s: 0,
        "__class__": property(lambda s: base),
        "__dict__": property(lambda s: getattr(value, "__dict__", {})),
        "__getattr__": lambda s, name: getattr(value, name),
        "__int__": lambda s: 0,
        "__index__": lambda s: 0,
        "__bool__": lambda s: True,
        "__module__": getattr(base, "__module__", "builtins"),
        "__qualname__": getattr(base, "__qualname__", base.__name__),
    }
    try:
        cls = type(base.__name__, (base,), ns)
        if base in (int, float, str, bytes, tuple, frozenset, complex):
            return base.__new__(cls, value)
        if base in (list, dict, set):
            return cls(value)
        liar = object.__new__(cls)
        object.__setattr__(liar, "__dict__", dict(getattr(value, "__dict__", {})))
        return liar
    except Exception:
        return object.__new__(type(base.__name__, (), ns))


def _forge_f5_call(fn, args, kwargs):
    return _forge_f5_liar(fn(*args, **kwargs))


_forge_wrap_all(_forge_f5_call)
