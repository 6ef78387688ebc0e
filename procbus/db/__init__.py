"""PostgreSQL access: connection pools, named queries and migrations."""

from procbus.db.pool import connect, create_pool
from procbus.db.queries import Queries, load_queries

__all__ = ["Queries", "connect", "create_pool", "load_queries"]
