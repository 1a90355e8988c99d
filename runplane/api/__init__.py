"""The HTTP API, shared by every cloud's function entrypoints."""
