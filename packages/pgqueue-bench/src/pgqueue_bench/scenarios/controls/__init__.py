"""``pgqueue bench controls``: pause, resume, concurrency and rate limits obeyed by real workers."""
