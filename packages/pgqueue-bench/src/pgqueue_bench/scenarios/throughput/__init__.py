"""``pgqueue bench throughput``: real workers draining no-op jobs, and the loops they are
measured against (the naive loop, the batched ceiling)."""
