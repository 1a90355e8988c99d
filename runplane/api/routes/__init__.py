"""The HTTP API's routes, one module per resource; importing a module declares its operations."""
