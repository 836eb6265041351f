"""A module-scoped autouse fixture that runs torch on one thread; import it into a test module to use it.

Small matmuls on shared CPUs: a second OpenMP thread spin-waits far more than it helps.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
