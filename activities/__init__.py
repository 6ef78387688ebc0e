"""Temporal activities: thin adapters from workflows to the procbus library."""
