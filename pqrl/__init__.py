"""pqrl: agentic reinforcement learning. The floor package: the Trajectory record, its codec, the
Redis trajectory store, the offline model cache and the CLI.

Kept import-light on purpose: ``import pqrl`` pulls in nothing, so compute code can import
``pqrl.trajectory`` (numpy only) where Redis, FastAPI or Docker are not installed.
"""

__version__ = "0.1.0"
