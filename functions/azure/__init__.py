"""Azure Functions app: the HTTP API, the dispatcher and the reaper (see function_app.py)."""
