"""What the drivers run on: PostgreSQL servers and their programs, worker and API processes,
network namespaces, a TCP proxy and small disks for the faults, the server's CPU time, and
the environment block every results file carries."""
