"""``pgqueue bench fairness``: a noisy neighbour's backlog beside small tenants."""
