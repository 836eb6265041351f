"""Real HTTP in tests: the project's in-thread server and free-port helpers, re-exported."""

from agent_loop.serving import serve_in_thread
from pqrl.redis_server import free_port

__all__ = ["free_port", "serve_in_thread"]
