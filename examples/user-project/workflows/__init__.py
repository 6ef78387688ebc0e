"""The application's procedures."""
