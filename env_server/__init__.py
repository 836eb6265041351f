"""FastAPI service hosting registered tool environments, with HTTP and in-process clients (issue #4)."""
