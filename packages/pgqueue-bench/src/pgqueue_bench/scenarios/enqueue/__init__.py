"""``pgqueue bench enqueue``: how fast jobs get in, beside raw SQL, the HTTP API and the peers."""
