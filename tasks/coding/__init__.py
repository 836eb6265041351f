"""The coding suite: small original modules with injected bugs, the ``coding-v1`` environment and
its tamper-resistant grader.

- ``repos/``: the original modules and their tests (data; each ``<name>/<name>.py`` with
  ``<name>/tests/test_<name>.py``);
- ``mutations`` and ``generate``: SWE-smith-style bug injection; ``python -m tasks.coding.generate``
  rewrites ``suite.jsonl`` (deterministic from its seed);
- ``capture``, ``diffs``, ``policy``, ``junit``, ``runner`` and ``grader``: grading (see
  tasks/coding/grader.py for the design and its remaining risks);
- ``env``: ``CodingEnv``, registered as ``coding-v1``.
"""

from tasks.coding.env import CodingEnv, builtin_suite
from tasks.coding.grader import CodingGrader, GradeResult, grading_slots

__all__ = ["CodingEnv", "CodingGrader", "GradeResult", "builtin_suite", "grading_slots"]
