"""pgqueue benchmark drivers."""
