"""Retention: tables that would only grow are trimmed by a periodic Temporal Schedule.

models: the Retention workflow's input and results; cleanup: the bounded deletes, one per kind
(done outbox rows, finished Spark jobs, expired snapshots and their files, applied batch fences,
long-gone bus members); schedule: the Schedule that starts the workflow.
"""
