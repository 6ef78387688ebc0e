"""procbus as a Temporal plugin (extension.py: `ProcbusPlugin`), with the activities the
procedure engine runs whatever the procedure (auth, locks, procedures, bus) and the worker's bus
membership (member.py)."""
