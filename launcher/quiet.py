"""``--quiet``: no progress bars, no progress logging and no library warnings, in this process and in
the processes it starts (an embedded job's engine and env server inherit the environment set here).

What remains: errors, pqrl's own warnings (a job stopped short, a deprecated variable) and a
command's result lines."""

from __future__ import annotations

import logging
import os
import warnings

__all__ = ["QUIET_ENV", "QUIET_HELP", "be_quiet"]

QUIET_HELP = "no progress bars or library warnings: only errors and the result"

# read by the libraries themselves at import or when they draw: tqdm (TQDM_DISABLE), Hugging Face
# (transformers' logger and its hub's bars), Python's warnings in child processes
QUIET_ENV = {
    "TQDM_DISABLE": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "PYTHONWARNINGS": "ignore",
}

_LIBRARIES = ("transformers", "huggingface_hub", "torch", "httpx", "httpcore", "urllib3", "uvicorn",
              "asyncio", "filelock", "datasets", "accelerate")  # fmt: skip


def be_quiet() -> None:
    """Silences progress and warnings from here on; call before the command imports its libraries."""
    os.environ.update(QUIET_ENV)
    warnings.simplefilter("ignore")
    # a later logging.basicConfig(level=INFO) in a command must not turn progress back on
    logging.disable(logging.INFO)
    for name in _LIBRARIES:
        logging.getLogger(name).setLevel(logging.ERROR)
