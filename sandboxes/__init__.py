"""Sandbox protocol, Docker backend, warm pool, reaper and offline sandbox images."""
