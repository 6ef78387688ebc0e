"""The typed search attributes procedures keep current, so the Temporal UI can filter on them."""

from __future__ import annotations

from temporalio.common import SearchAttributeKey

PROCEDURE_TYPE = SearchAttributeKey.for_keyword("ProcedureType")
PROCEDURE_STATE = SearchAttributeKey.for_keyword("ProcedureState")
PROCEDURE_TARGET = SearchAttributeKey.for_keyword("ProcedureTarget")
# Temporal's own, on each run a Schedule starts: the schedule's ID. Any start may set it too,
# so it only says which schedule a run claims to be of (procbus/plugin/auth.py checks that one).
SCHEDULED_BY = SearchAttributeKey.for_keyword("TemporalScheduledById")

# Registered when the embedded server starts (`--search-attribute NAME=Keyword`); a Temporal
# cluster of your own needs them too (`temporal operator search-attribute create`).
SEARCH_ATTRIBUTES: dict[str, str] = {
    key.name: "Keyword" for key in (PROCEDURE_TYPE, PROCEDURE_STATE, PROCEDURE_TARGET)
}
