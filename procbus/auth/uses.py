"""A start's principal token starts one run: the first run that presents it claims it in
PostgreSQL. Anyone who may read a workflow's history can copy its token, and Temporal lets a
closed workflow's ID be started again, so without this a copy would run as its principal."""

from __future__ import annotations

from datetime import datetime

import asyncpg

from procbus.db import load_queries

QUERIES = "procbus.auth"
# Claims are kept this long past their token's expiry: a run started in time whose worker only
# verifies it later (workers down) still finds the first run's claim.
KEPT_PAST_EXPIRY_SECONDS = 7 * 24 * 3600.0


class TokenUses:
    """Which run used each principal token first, so a copied token starts nothing."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool
        self.queries = load_queries(QUERIES)

    async def first_run(
        self,
        token_mac: str,
        workflow_id: str,
        run_id: str,
        expires_at: datetime,
        kept_seconds: float = KEPT_PAST_EXPIRY_SECONDS,
    ) -> str:
        """The run that used the token with this signature first: `run_id` itself when this is
        its first use. Claims go `kept_seconds` past their token's expiry: a worker verifies no
        start later than that (WorkerAuth.late_seconds)."""
        async with self.pool.acquire() as connection, connection.transaction():
            await connection.execute(self.queries["forget_token_uses"], kept_seconds)
            first: str = await connection.fetchval(
                self.queries["claim_token_use"],
                token_mac,
                workflow_id,
                run_id,
                expires_at,
            )
        return first
