"""The checker of the topics: what the application committed was delivered, whole, in commit
order per key, and nothing it did not commit ever was."""

from __future__ import annotations

import collections
from typing import Any

from procbus.testing.nemesis.operations import GROUPED_TOPIC, TOPIC_PATHS


def check_topics(history: list[dict[str, Any]], end: dict[str, Any]) -> list[str]:
    """Every event of a committed transaction was delivered (at least once), none of a
    transaction that did not commit ever was, a transaction whose commit failed was delivered
    whole or not at all, per topic and key the first deliveries came in commit order, and no
    request of the grouped topic held part of a transaction."""
    committed: dict[tuple[str, int], tuple[str, str]] = {}  # (txn, n) -> (topic, key)
    not_committed: set[tuple[str, int]] = set()
    unknown: dict[str, set[int]] = {}
    order: list[tuple[str, int]] = []  # the events that may be delivered, in commit order
    events_of: dict[tuple[str, str], set[int]] = collections.defaultdict(set)  # (txn, topic)
    for recorded in history:
        if recorded["event"] != "txn":
            continue
        for n, (topic, key) in enumerate(recorded["events"]):
            event = (recorded["txn"], n)
            if recorded["outcome"] in ("committed", "unknown"):
                committed[event] = (topic, key)
                order.append(event)
                events_of[(recorded["txn"], topic)].add(n)
                if recorded["outcome"] == "unknown":
                    unknown.setdefault(recorded["txn"], set()).add(n)
            else:
                not_committed.add(event)
    first_seen: dict[tuple[str, int], int] = {}
    violations = []
    for index, request in enumerate(end["sink_requests"]):
        by_txn: dict[str, set[int]] = collections.defaultdict(set)
        for body in request["events"]:
            event = (body["data"]["txn"], body["data"]["n"])
            first_seen.setdefault(event, index)
            by_txn[event[0]].add(event[1])
            if event in not_committed:
                violations.append(f"{event[0]}#{event[1]} was delivered, but never committed")
            elif event not in committed:
                violations.append(f"{event[0]}#{event[1]} was delivered, but never published")
            elif committed[event] != (body["topic"], body["key"]):
                violations.append(f"{event[0]}#{event[1]} came as {body['topic']}/{body['key']}")
        if request["path"] == TOPIC_PATHS[GROUPED_TOPIC].split("?")[0]:
            for txn, numbers in sorted(by_txn.items()):
                whole = events_of.get((txn, GROUPED_TOPIC), set())
                if numbers != whole:
                    violations.append(
                        f"a grouped batch held {sorted(numbers)} of {txn}'s {sorted(whole)}"
                    )
    for txn, numbers in sorted(unknown.items()):
        seen = {n for n in numbers if (txn, n) in first_seen}
        if seen and seen != numbers:
            violations.append(f"{txn} (commit unknown) was delivered in part: {sorted(seen)}")
    lost = [e for e in order if e not in first_seen and e[0] not in unknown]
    violations += [f"{txn}#{n} was committed but never delivered" for txn, n in lost]
    by_key: dict[tuple[str, str], list[tuple[str, int]]] = collections.defaultdict(list)
    for event in order:
        if event in first_seen:
            by_key[committed[event]].append(event)
    for (topic, key), events in sorted(by_key.items()):
        arrived = sorted(events, key=lambda event: first_seen[event])
        if arrived != events:
            out_of_order = next(a for a, b in zip(arrived, events, strict=True) if a != b)
            violations.append(
                f"{topic}/{key}: {out_of_order[0]}#{out_of_order[1]} arrived out of commit order"
            )
    if any(depth != 0 for depth in end.get("topic_depths", {}).values()):
        violations.append(f"topics not drained after the heal: {end['topic_depths']}")
    return violations
