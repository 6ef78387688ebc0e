"""Errors a user can hit: each says what was wrong and what to do."""


class ProcbusError(Exception):
    """An error with a message meant for the person running procbus (no traceback needed)."""


class ConfigError(ProcbusError):
    """A setting has a bad value."""


class StackError(ProcbusError):
    """The embedded stack cannot start, or no stack is reachable."""


class MigrationError(ProcbusError):
    """The database schema cannot be brought up to date."""


class SparkUnavailable(ProcbusError):
    """Spark cannot start on this machine (usually: no Java)."""
