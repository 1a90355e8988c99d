"""The runplane worker agent: pulls runs from a pool queue and runs them in Docker."""
