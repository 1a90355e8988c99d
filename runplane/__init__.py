"""runplane: an event-driven control plane for containerized runs."""

__version__ = "0.3.0"
