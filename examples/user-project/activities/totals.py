"""The steps of PublishDailyTotals: a Spark job, its undo, and a publish in one transaction."""

from __future__ import annotations

import asyncio
import shutil
from datetime import date
from decimal import Decimal
from typing import TYPE_CHECKING

from pydantic import BaseModel
from temporalio import activity

from procbus import spark_job, step_key
from procbus.hooks import transaction

if TYPE_CHECKING:
    import asyncpg
    from pyspark.sql import SparkSession

# The application's own table, in the same database as procbus's, so a publish commits with it.
SCHEMA = """
CREATE TABLE IF NOT EXISTS "daily_totals" (
    "day" date NOT NULL,
    "region" text NOT NULL,
    "orders" bigint NOT NULL,
    "amount" numeric(14, 2) NOT NULL,
    "published_by" text NOT NULL,  -- the step that wrote it: a retry finds its own rows
    PRIMARY KEY ("day", "region")
)
"""
# Workers of one application start together: PostgreSQL's IF NOT EXISTS does not hold against
# a concurrent CREATE (the second fails on pg_type's unique index), so they take turns.
SCHEMA_LOCK = "SELECT pg_advisory_xact_lock(hashtext('sales-reports schema'))"
PUBLISHED_BY = 'SELECT count(*) FROM "daily_totals" WHERE "published_by" = $1'
UPSERT_TOTAL = """
INSERT INTO "daily_totals" ("day", "region", "orders", "amount", "published_by")
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT ("day", "region") DO UPDATE
SET "orders" = EXCLUDED."orders", "amount" = EXCLUDED."amount",
    "published_by" = EXCLUDED."published_by"
"""


class ComputeTotals(BaseModel):
    day: str
    orders: str
    output: str


class RegionTotal(BaseModel):
    region: str
    orders: int
    amount: Decimal


class Totals(BaseModel):
    day: str
    output: str
    regions: list[RegionTotal]


class PublishTotals(BaseModel):
    topic: str
    totals: Totals


class PublishedTotals(BaseModel):
    day: str
    regions: list[RegionTotal]
    topic: str


@spark_job
def compute_totals(spark: SparkSession, request: ComputeTotals) -> Totals:
    """Runs in the worker's Spark session; its progress shows in the step's heartbeat."""
    from pyspark.sql import functions

    schema = "region STRING, amount DECIMAL(12,2)"
    orders = spark.read.csv(request.orders, header=True, schema=schema)
    by_region = orders.groupBy("region").agg(
        functions.count("*").alias("orders"), functions.sum("amount").alias("amount")
    )
    # Overwritten as a whole: a retried attempt leaves one copy, not two.
    by_region.write.mode("overwrite").parquet(request.output)
    written = spark.read.parquet(request.output).orderBy("region").collect()
    return Totals(
        day=request.day,
        output=request.output,
        regions=[RegionTotal(**row.asDict()) for row in written],
    )


@activity.defn
async def discard_totals(request: ComputeTotals) -> None:
    """The undo of `compute`: whatever the job wrote goes."""
    await asyncio.to_thread(shutil.rmtree, request.output, ignore_errors=True)


async def create_schema(pool: asyncpg.Pool) -> None:
    """The application's table, created once however many workers start at the same moment."""
    async with pool.acquire() as connection, connection.transaction():
        await connection.execute(SCHEMA_LOCK)
        await connection.execute(SCHEMA)


class TotalsActivities:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    @activity.defn
    async def publish_totals(self, request: PublishTotals) -> PublishedTotals:
        totals = request.totals
        published = PublishedTotals(day=totals.day, regions=totals.regions, topic=request.topic)
        key = step_key()
        async with self.pool.acquire() as connection, transaction(connection) as tx:
            if await connection.fetchval(PUBLISHED_BY, key):
                return published  # this step committed before its worker could say so
            day = date.fromisoformat(totals.day)
            rows = [
                (day, total.region, total.orders, total.amount, key) for total in totals.regions
            ]
            await connection.executemany(UPSERT_TOTAL, rows)
            # Queued in this transaction: delivered if and only if the rows are committed.
            await tx.publish(
                request.topic,
                published.model_dump(mode="json"),
                key=totals.day,
                type="DailyTotals",
            )
        return published
