"""The SGLang contract's fixtures, shared by ``test_sglang_source`` and ``test_sglang_imports``."""

from tests.engine.sglang_contract import home, sent, srt  # noqa: F401  (fixtures)
