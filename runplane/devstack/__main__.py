"""``python -m runplane.devstack CONFIG_JSON``: serve a local stack in this process (process.py)."""

import logging
import sys

from runplane.devstack.process import config_from_json, serve

if len(sys.argv) != 2:
    sys.exit("usage: python -m runplane.devstack CONFIG_JSON")
logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
try:
    serve(config_from_json(sys.argv[1]))
except (ValueError, OSError) as e:  # a bad config, a taken port, Azurite that does not start
    sys.exit(f"runplane.devstack: {e}")
