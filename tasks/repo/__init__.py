"""Coding tasks from real repositories (SWE-bench style): the task model, the environment, the
importers of public formats and the checks run before training."""
