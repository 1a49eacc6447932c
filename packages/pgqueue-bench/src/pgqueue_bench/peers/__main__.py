"""``python -m pgqueue_bench.peers``: the side-by-side runs (see :mod:`.compare`)."""

from pgqueue_bench.peers.compare import main

main()
