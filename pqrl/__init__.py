"""pqrl: agentic reinforcement learning. The floor package, which imports no other package of the
project: the Trajectory record and its codec, the tool-call record, the Redis trajectory store, a
private Redis server, the weights process group, the offline model cache, cache paths, the malloc
heap trimming of long-running processes and ``Settings``, the base of every component config.

Kept import-light on purpose: ``import pqrl`` pulls in nothing, so compute code can import
``pqrl.trajectory`` (numpy only) where Redis, FastAPI or Docker are not installed.
"""

__version__ = "0.1.0"
