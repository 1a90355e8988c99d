"""Thin cloud entrypoints over the runplane services."""
