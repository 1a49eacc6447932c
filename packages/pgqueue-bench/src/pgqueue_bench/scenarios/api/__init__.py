"""``pgqueue bench api``: ``pgqueue-api`` beside the minimal FastAPI app a team would write."""
