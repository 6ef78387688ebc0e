"""The `procbus` CLI and the Python starter scripts a Temporal user would write."""
