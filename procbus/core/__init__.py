"""The bottom layer: what every other part of procbus shares, importing nothing of procbus but
its errors. Names and their rules, the activity IDs of steps, `WorkflowInput`, fences, the
outcomes of a broadcast, the authentication a run records, endpoints, fault rules, and the
names of procbus's metrics, search attributes and own workflows. Pure: no I/O, safe in the
workflow sandbox.

Nothing is imported here, so each module pays only for what it uses.
"""
