"""The embedded local stack behind ``runplane dev``."""
