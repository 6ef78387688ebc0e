"""Undo coverage: run a procedure once per cut point and prove each rollback left nothing behind.

A cut point is where a run is interrupted: a step fails before its action runs, a step's action
runs and its result is lost, the procedure is cancelled while a step runs, or the worker running
a step stops mid-step. Before the pivot a cut must end ROLLED_BACK with no residue (the user's
`residue` check returns nothing); past it, the procedure must finish (SUCCEEDED, and the user's
`missing` check returns nothing); a stopped worker, or a cancel at the pivot, may end either way
(`CutPoint.expected`). Faults are procbus's own (PROCBUS_FAULTS rules, applied
by the worker the kit starts for each cut); nothing here patches the procedure.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Generic, TypeVar

from temporalio.client import Client, WorkflowFailureError, WorkflowHandle

from procbus.procedures import ProcedureInput, ProcedureState, ProcedureStatus

InputT = TypeVar("InputT", bound=ProcedureInput)

# A worker on the kit's task queue that applies `faults` (PROCBUS_FAULTS syntax), while inside.
StartWorker = Callable[[str], AbstractAsyncContextManager[Any]]
# What is wrong after a run, one line each: empty when all is well.
Check = Callable[[InputT], Awaitable[list[str]]]


class CutKind(StrEnum):
    """How a run is interrupted at a step."""

    FAIL_BEFORE = "fail_before"  # the step fails before its action runs
    FAIL_AFTER = "fail_after"  # the action runs, its result is lost
    CANCEL = "cancel"  # the procedure is cancelled while the step runs
    KILL = "kill"  # the worker stops mid-step; another one takes the work over, or undoes it


# How often a run that has not ended is asked whether it is STUCK.
STUCK_POLL_SECONDS = 1.0
# What a test suite can afford by default; KILL starts two workers a cut.
DEFAULT_KINDS = (CutKind.FAIL_BEFORE, CutKind.FAIL_AFTER, CutKind.CANCEL)


@dataclass(frozen=True)
class CutPoint:
    kind: CutKind
    step: str
    index: int  # the step's place in the procedure, from 0
    past_pivot: bool  # a failure here rolls forward: the run must finish
    pivot: bool = False  # the pivot step itself

    @property
    def expected(self) -> tuple[ProcedureState, ...]:
        """The ends this cut may have: rolled back before the pivot, finished past it."""
        if self.past_pivot:
            return (ProcedureState.SUCCEEDED,)
        if self.kind is CutKind.KILL or (self.pivot and self.kind is CutKind.CANCEL):
            # Another worker takes the step over, or a broadcast fails on the stopped worker's
            # member; a pivot whose write committed before the cancel reached it finishes.
            return (ProcedureState.SUCCEEDED, ProcedureState.ROLLED_BACK)
        return (ProcedureState.ROLLED_BACK,)

    def __str__(self) -> str:
        return f"{self.kind.value} {self.step}"


@dataclass
class CutResult:
    cut: CutPoint
    state: ProcedureState | None  # None: the run did not end in time
    problems: list[str]  # residue after a rollback, or what a finished run lacks
    seconds: float
    error: str | None = None

    @property
    def proven(self) -> bool:
        return self.state in self.cut.expected and not self.problems and self.error is None

    def line(self) -> str:
        verdict = "ok  " if self.proven else "FAIL"
        state = self.state.value if self.state else "not ended"
        text = f"{verdict} {self.cut!s:<40} {state:<12} {self.seconds:6.2f} s"
        if self.state not in self.cut.expected:
            text += f"  expected {' or '.join(state.value for state in self.cut.expected)}"
        details = [*self.problems, *([self.error] if self.error else [])]
        return text + "".join(f"\n       - {detail}" for detail in details)


@dataclass
class UndoCoverageReport:
    procedure: str
    steps: list[str]
    pivot: str | None
    clean_seconds: float  # the clean run's, worker start included like each cut point's
    results: list[CutResult] = field(default_factory=list)

    @property
    def proven(self) -> int:
        return sum(result.proven for result in self.results)

    @property
    def total(self) -> int:
        return len(self.results)

    @property
    def failed(self) -> list[CutResult]:
        return [result for result in self.results if not result.proven]

    def summary(self) -> str:
        """Return the report as text: one line per cut point, then the count proven."""
        pivot = f", pivot {self.pivot}" if self.pivot else ", no pivot"
        head = f"undo coverage of {self.procedure} (steps {', '.join(self.steps)}{pivot})"
        clean = f"ok   {'clean run':<40} {'SUCCEEDED':<12} {self.clean_seconds:6.2f} s"
        lines = [head, clean, *(result.line() for result in self.results)]
        lines.append(f"cut points proven: {self.proven} / {self.total}")
        return "\n".join(lines)

    def assert_covered(self) -> None:
        """Raise AssertionError listing every cut point not proven, with the summary."""
        if self.failed:
            listed = ", ".join(str(result.cut) for result in self.failed)
            raise AssertionError(f"cut points not proven: {listed}\n{self.summary()}")


@dataclass
class UndoCoverage(Generic[InputT]):
    """Run `procedure` once clean, then once per cut point, each on a worker of its own.

    Args:
        client: the Temporal client.
        task_queue: the queue the workers from `start_worker` poll.
        start_worker: a worker on `task_queue` applying the fault rules it is given.
        procedure: the procedure's workflow type name.
        make_input: the input of one run, given a name unique to that run (to keep runs apart).
        residue: what a rolled-back run left behind (empty: nothing).
        missing: what a finished run lacks (empty: complete); none by default.
        prepare: run before each run, once its worker runs: what the procedure needs to exist.
        kinds: the cut kinds to run.
        steps: the steps to cut at; every step of the clean run by default.
        phases: the bus phase to fault for a broadcast step (`apply` unless named here).
        cancel_delay: how long a step is held up so the cancellation lands while it runs.
        step_timeout_seconds: a KILL cut's step timeout: the step moves to the next worker then.
        timeout_seconds: how long one run may take before it counts as not ended.
    """

    client: Client
    task_queue: str
    start_worker: StartWorker
    procedure: str
    make_input: Callable[[str], InputT]
    residue: Check[InputT]
    missing: Check[InputT] | None = None
    prepare: Callable[[InputT], Awaitable[None]] | None = None
    kinds: Sequence[CutKind] = DEFAULT_KINDS
    steps: Sequence[str] | None = None
    phases: dict[str, str] = field(default_factory=dict)
    cancel_delay: float = 1.0
    step_timeout_seconds: float = 2.0
    timeout_seconds: float = 60.0

    async def run(self) -> UndoCoverageReport:
        """Return the report of a clean run's steps and of every cut point."""
        started = time.monotonic()
        clean = await self._clean_run()
        steps = clean.steps_done
        pivot = steps.index(clean.pivot_step) if clean.pivot_step in steps else len(steps)
        report = UndoCoverageReport(
            self.procedure, steps, clean.pivot_step, time.monotonic() - started
        )
        unknown = sorted(set(self.steps or ()) - set(steps))
        if unknown:
            raise ValueError(f"{self.procedure} has no steps {unknown}: its steps are {steps}")
        broadcasts = set(clean.broadcasts)
        for index, step in enumerate(steps):
            if self.steps is not None and step not in self.steps:
                continue
            for kind in self.kinds:
                cut = CutPoint(kind, step, index, index > pivot, pivot=index == pivot)
                report.results.append(await self._cut(cut, step in broadcasts))
        return report

    async def _clean_run(self) -> ProcedureStatus:
        request = self.make_input(self._run_name("clean"))
        async with self.start_worker(""):
            handle = await self._start(request, "clean")
            await handle.result()
            status = await self._status(handle)
        problems = await self.missing(request) if self.missing else []
        if problems:
            raise AssertionError(f"a clean {self.procedure} run is incomplete: {problems}")
        return status

    async def _cut(self, cut: CutPoint, broadcast: bool) -> CutResult:
        name = self._run_name(f"{cut.kind.value}-{cut.step}")
        request = self.make_input(name)
        if cut.kind is CutKind.KILL:
            request = request.model_copy(update={"step_timeout_seconds": self.step_timeout_seconds})
        started = time.monotonic()
        state, error = None, None
        try:
            async with asyncio.timeout(self.timeout_seconds):
                status = await self._interrupted_run(cut, self._target(cut, broadcast), request)
            state = status.state
            if state is ProcedureState.STUCK:
                error = f"STUCK at {status.stuck_step}: {status.stuck_error}"
        except TimeoutError:
            error = f"not ended after {self.timeout_seconds:g} s"
        check = self.residue if state is ProcedureState.ROLLED_BACK else self.missing
        problems = await check(request) if check is not None and state is not None else []
        return CutResult(cut, state, problems, time.monotonic() - started, error)

    def _target(self, cut: CutPoint, broadcast: bool) -> str:
        step = f"{cut.step}.{self.phases.get(cut.step, 'apply')}" if broadcast else cut.step
        return f"{self.procedure}.{step}"

    async def _interrupted_run(
        self, cut: CutPoint, target: str, request: InputT
    ) -> ProcedureStatus:
        # Past the pivot a fault fires once: the roll-forward must get past it.
        once = "=1" if cut.past_pivot else ""
        if cut.kind in (CutKind.FAIL_BEFORE, CutKind.FAIL_AFTER):
            async with self.start_worker(f"{target}:{cut.kind.value}{once}"):
                return await self._outcome(await self._start(request, cut.kind))
        if cut.kind is CutKind.CANCEL:
            async with self.start_worker(f"{target}:delay={self.cancel_delay:g}"):
                handle = await self._start(request, cut.kind)
                await self._until_running(handle, cut.step)
                await handle.cancel()
                return await self._outcome(handle)
        # KILL: the first worker holds the step until it is stopped; the next one finishes it.
        async with self.start_worker(f"{target}:delay_first=600"):
            handle = await self._start(request, cut.kind)
            await self._until_running(handle, cut.step)
        async with self.start_worker(""):  # one worker per queue at a time in one process
            return await self._outcome(handle)

    async def _start(self, request: InputT, what: str) -> WorkflowHandle[Any, Any]:
        # On the run's worker: what it prepares may be work for a procedure of its own.
        if self.prepare is not None:
            await self.prepare(request)
        return await self.client.start_workflow(
            self.procedure,
            request,
            id=f"undo-{self.procedure}-{what}-{uuid.uuid4().hex[:8]}",
            task_queue=self.task_queue,
        )

    async def _until_running(self, handle: WorkflowHandle[Any, Any], step: str) -> None:
        while (await self._status(handle)).step_running != step:  # noqa: ASYNC110 (a query)
            await asyncio.sleep(0.05)

    async def _outcome(self, handle: WorkflowHandle[Any, Any]) -> ProcedureStatus:
        """Return the run's status once it ended, or once STUCK (it waits for an operator)."""
        ended = asyncio.ensure_future(self._ended(handle))
        try:
            while not (await asyncio.wait({ended}, timeout=STUCK_POLL_SECONDS))[0]:
                status = await self._status(handle)
                if status.state is ProcedureState.STUCK:
                    return status
        finally:
            ended.cancel()
        return await self._status(handle)

    @staticmethod
    async def _ended(handle: WorkflowHandle[Any, Any]) -> None:
        with contextlib.suppress(WorkflowFailureError):
            await handle.result()

    @staticmethod
    async def _status(handle: WorkflowHandle[Any, Any]) -> ProcedureStatus:
        status: ProcedureStatus = await handle.query("status", result_type=ProcedureStatus)
        return status

    def _run_name(self, what: str) -> str:
        return f"{what}_{uuid.uuid4().hex[:6]}".replace("-", "_").lower()
