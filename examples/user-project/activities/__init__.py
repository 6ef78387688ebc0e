"""The application's activities: what its procedures' steps do."""
