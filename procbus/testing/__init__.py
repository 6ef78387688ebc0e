"""Helpers for testing procbus itself and what runs on it: a cluster of hosts on one machine."""
