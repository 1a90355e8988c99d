"""Compute backends, one package each (``registry.py`` names them). A backend whose SDK is missing is
switched off."""
