"""pgqueue worker: runs task handlers on jobs claimed under leases."""
