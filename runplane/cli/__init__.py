"""The ``runplane`` command line."""
