"""pgqueue HTTP API."""
