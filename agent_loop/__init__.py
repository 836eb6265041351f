"""The multi-turn agent loop, tool-call parsing and the async rollout manager."""
