"""Engine clients, the multi-turn agent loop and the async rollout manager (issue #6)."""
