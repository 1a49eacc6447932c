"""pytest fixtures for pgqueue handler tests; the fixtures live in ``pytest_pgqueue.plugin``."""
