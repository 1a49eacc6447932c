"""``pgqueue bench scale``: what a job costs with months of finished history kept."""
