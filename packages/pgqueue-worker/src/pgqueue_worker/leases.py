"""The leases a worker holds: written by the claim loop, read by the heartbeat."""

from __future__ import annotations

import threading

from pgqueue import Lease


class LeaseSet:
    """Leases held right now, keyed by job id. A lease is held from the claim until the
    attempt's outcome is written, or until the worker learns it was lost."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._leases: dict[int, Lease] = {}

    def add(self, leases: list[Lease]) -> None:
        """Hold ``leases``."""
        with self._lock:
            for lease in leases:
                self._leases[lease.job_id] = lease

    def release(self, leases: list[Lease]) -> None:
        """Stop holding ``leases``, skipping those not held (already released, or the
        job has been claimed again since under a new token)."""
        with self._lock:
            for lease in leases:
                held = self._leases.get(lease.job_id)
                # Mostly the very object added: `is` spares comparing the tokens.
                if held is lease or held == lease:
                    del self._leases[lease.job_id]

    def holds(self, lease: Lease) -> bool:
        """True while ``lease`` is held."""
        with self._lock:
            return self._leases.get(lease.job_id) == lease

    def snapshot(self) -> list[Lease]:
        """Every lease held right now."""
        with self._lock:
            return list(self._leases.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._leases)
