"""What the demo showed: its report, as `procbus demo --json` prints it (tests/e2e read it). A
scene fills its part; a scene left out by `--only` stays None."""

from __future__ import annotations

from pydantic import BaseModel, Field

from procbus.procedures import ProcedureState, ProcedureStatus
from procbus.stack import StackCheckResult


class DemoProcedure(BaseModel):
    procedure_id: str
    url: str | None
    status: ProcedureStatus


class DemoHooks(BaseModel):
    committed_hook_result: str
    committed_workflow_id: str
    committed_workflow_run_id: str | None
    rolled_back_hook_error: str
    rolled_back_workflow_started: bool
    outbox_rows_of_rolled_back: int


class DemoLocks(BaseModel):
    create_table_id: str
    create_table_state: ProcedureState
    delete_namespace_id: str
    waiting_for: list[str]
    lock_table_while_waiting: list[str]
    delete_namespace_state: ProcedureState
    delete_namespace_error: str | None
    lost_locks_delete_table_id: str
    lost_locks_delete_table_state: ProcedureState
    locks_taken_again: list[str]


class DemoBadInput(BaseModel):
    workflow_id: str
    temporal_cli_exit_code: int
    error_type: str
    error: str


class DemoTopics(BaseModel):
    topic: str
    published: int
    failed_attempts_while_down: int
    delivered_once_each: bool
    key_order_kept: bool
    signatures_verified: int
    delivered_while_a_key_failed: int
    dead_letter_id: int
    redriven_with_its_webhook_id: bool


class DemoGroupedBatches(BaseModel):
    topic: str
    batch_size: int
    batch_events: int
    transaction_whole: bool
    batch_id: str
    sync_ack: str
    sync_nack_error: str | None


class DemoKafka(BaseModel):
    topic: str
    kafka_topic: str
    broker: str
    transaction_events: int
    seen_by_read_committed: int
    one_batch_id: bool
    keys_in_order: bool


class DemoAccess(BaseModel):
    grant_id: str
    revoke_id: str
    granted: dict[str, str] = Field(description="worker -> its outcome of the grant")
    revoked: dict[str, str] = Field(description="worker -> its outcome of the revoke")
    grants_left_on_workers: dict[str, int]
    refused_delete_error: str


class DemoTableData(BaseModel):
    table: str
    load_ids: list[str]
    rows: int
    files_before: int
    compaction_id: str
    progress_seen: list[str]
    files_after: int
    same_rows_after: bool
    snapshots: list[str] = Field(description="newest first: ID and operation")
    schedule_id: str
    schedule_next_run: str | None


class DemoPipeline(BaseModel):
    source_table: str
    lake_table: str
    topic: str
    snapshot_rows: int
    transfers_committed: int
    transfers_rolled_back: int
    lake_snapshots_read: int
    lake_totals_seen: list[int] = Field(description="each distinct total a reader saw")
    expected_total: int
    batches_applied: int
    transactions_applied: int
    lake_equals_source: bool


class DemoOwnProcedure(BaseModel):
    module: str
    task_queue: str
    procedure_id: str
    state: ProcedureState
    broadcast_reached: list[str] = Field(description="the workers that dropped the table")
    refused_id: str
    refused_state: ProcedureState
    notes_after_rollback: list[str] = Field(description="the user's system: one note, kept")
    rows_counted: int | None = Field(description="the rows its Spark job step counted")


class DemoReport(BaseModel):
    """What the demo showed; a scene left out by `--only` is None (the stack check's fields are
    filled by the first scene, which always runs)."""

    started_stack: bool
    temporal_address: str
    ui_url: str | None
    steps: list[str]
    stack_check_workflow_id: str | None = None
    stack_check_url: str | None = None
    stack_check: StackCheckResult | None = None
    create_table: DemoProcedure | None = None
    failed_create_table: DemoProcedure | None = None
    residue_after_rollback: list[str] | None = None
    hooks: DemoHooks | None = None
    locks: DemoLocks | None = None
    bad_input: DemoBadInput | None = None
    topics: DemoTopics | None = None
    grouped: DemoGroupedBatches | None = None
    kafka: DemoKafka | None = None
    access: DemoAccess | None = None
    table_data: DemoTableData | None = None
    pipeline: DemoPipeline | None = None
    own_procedure: DemoOwnProcedure | None = None
    metrics_url: str | None
