"""The type names Temporal knows procbus's own workflows by (not the procedures a user starts):
the library starts, schedules and refuses them by name, below the workflows themselves
(procbus.workflows), which take their names from here. Recorded histories, running Schedules
and workflows in flight hold these names: they never change."""

from __future__ import annotations

BROADCAST = "Broadcast"
OUTBOX_SWEEP = "OutboxSweep"
RETENTION = "Retention"
STACK_CHECK = "StackCheck"
TOPIC_DELIVERY = "TopicDelivery"
