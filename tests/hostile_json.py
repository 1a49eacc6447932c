"""JSON nested deeper than Python's json module decodes, which PostgreSQL still stores
in jsonb: the suite's undecodable rows and payloads.

Python's limit depends on its version: about 1,000 levels on 3.11 (the interpreter's
recursion limit) and 10,000 on 3.13 (a limit of its own for C code). PostgreSQL's parser
goes about 14,500 levels deep on 15 and 16,300 on 18 at the default max_stack_depth of
2 MB. So a depth between those is undecodable on every Python and server CI runs."""

DEPTH = 12_000

TOO_DEEP_ARRAYS = "[" * DEPTH + "]" * DEPTH
"""Arrays in arrays, DEPTH levels deep."""

TOO_DEEP_OBJECTS = '{"a": ' * DEPTH + "1" + "}" * DEPTH
"""Objects in objects, DEPTH levels deep."""
