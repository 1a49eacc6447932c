"""``pgqueue bench soak``: an hour of chaos under a mixed, realistic workload."""
