"""The embedded stack: the real Temporal server and PostgreSQL, started and stopped by procbus."""
