"""SQL shipped with pgqueue: named queries and numbered migrations."""
