"""Use cases. They speak to ports only, never to a cloud SDK."""
