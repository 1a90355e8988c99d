"""AWS Lambda entrypoints: api, dispatcher, reaper."""
