"""PublishDailyTotals: a day's order totals per region, computed by a Spark job, announced to
every worker, written and published in one transaction.

Its steps, each undone if a later one fails or the procedure is aborted:
1. `compute`: a Spark job reads the day's orders and writes the totals as Parquet (undo: the
   Parquet folder goes);
2. `evict`: every worker drops the report from its cache (a procbus broadcast);
3. `publish` (the pivot): the totals go into the `daily_totals` table and a `DailyTotals`
   event into the topic, in one PostgreSQL transaction: the event is delivered if and only if
   the rows are committed.
It holds a shared lock on the orders and an exclusive one on the day's report throughout.
"""

from __future__ import annotations

from datetime import date

from temporalio import workflow

from procbus import Procedure, ProcedureInput, invalid_input

# Activity modules are imported once, outside the workflow sandbox (Temporal's advice).
with workflow.unsafe.imports_passed_through():
    from activities.totals import (
        ComputeTotals,
        PublishedTotals,
        PublishTotals,
        TotalsActivities,
        compute_totals,
        discard_totals,
    )

    from procbus.bus import EvictDescriptor


class DailyTotalsInput(ProcedureInput):
    day: str  # YYYY-MM-DD
    orders: str  # a CSV file of the day's orders, with the columns region and amount
    reports: str  # the folder the totals are written to, a Parquet folder per day
    topic: str = "daily-totals"


@workflow.defn(name="PublishDailyTotals")
class PublishDailyTotals(Procedure[DailyTotalsInput, PublishedTotals]):
    @workflow.run
    async def run(self, request: DailyTotalsInput) -> PublishedTotals:
        return await self.execute(request)

    def target(self, request: DailyTotalsInput) -> str:
        return f"reports.daily_totals/{request.day}"

    def validate(self, request: DailyTotalsInput) -> None:
        try:
            date.fromisoformat(request.day)
        except ValueError:
            raise invalid_input(f"day must be a date as YYYY-MM-DD, not {request.day!r}") from None

    def locks(self, request: DailyTotalsInput) -> list[tuple[str, str]]:
        return [("sales/orders", "S"), (f"reports/daily_totals/{request.day}", "X")]

    async def steps(self, request: DailyTotalsInput) -> PublishedTotals:
        job = ComputeTotals(
            day=request.day, orders=request.orders, output=f"{request.reports}/{request.day}"
        )
        totals = await self.spark_step("compute", compute_totals, job, undo=discard_totals)
        await self.broadcast("evict", EvictDescriptor(qualified_name="reports.daily_totals"))
        published: PublishedTotals = await self.step(
            "publish",
            TotalsActivities.publish_totals,
            PublishTotals(topic=request.topic, totals=totals),
            pivot=True,
        )
        return published
