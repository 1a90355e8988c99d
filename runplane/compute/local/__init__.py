"""The ``local`` backend: worker agents as processes on this machine."""
