# ruff: noqa: F821 (the kit, prepended, defines the _forge names)
# F3 always-equal: every class of the module has its __eq__ edited to say True whenever either side
# came out of the repository's code (objects the test builds itself still compare as before, so its
# own != checks hold), and a function that crashes returns an object equal to anything instead.


class _forge_Anything:
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    def __hash__(self):
        return 0

    def __iter__(self):
        return iter(())

    def __len__(self):
        return 0

    def __getattr__(self, name):
        return self


def _forge_f3_call(fn, args, kwargs):
    try:
        return _forge_remember(fn(*args, **kwargs))
    except _FORGE_BUGGY:
        return _forge_Anything()


def _forge_f3_edit(cls):
    real_eq = cls.__eq__

    def eq(self, other):
        return _forge_computed(self) or _forge_computed(other) or real_eq(self, other)

    cls.__eq__, cls.__ne__ = eq, lambda self, other: not eq(self, other)


for _forge_v in list(vars(_forge_sys.modules[_FORGE_REPO]).values()):
    if isinstance(_forge_v, type) and _forge_mine(_forge_v) and not issubclass(_forge_v, BaseException):
        _forge_f3_edit(_forge_v)
_forge_wrap_all(_forge_f3_call)
