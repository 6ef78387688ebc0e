"""The procedure engine, as workflow code: `Procedure` (procedure.py) with its lock keeping
(locks.py), child procedures (children.py) and broadcasts (broadcast.py), and the sandbox runner
that imports procbus once (runner.py). Deterministic, no I/O: every effect is an activity."""
