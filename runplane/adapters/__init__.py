"""Adapters: one package per cloud, each implementing the ports."""
