"""``pgqueue bench effects``: side effects in the application's own tables under chaos."""
