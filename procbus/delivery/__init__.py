"""Delivery: endpoint clients behind one small interface (clients; webhook, amqp), a delivery
round (dispatch), a delivery run's rounds (rounds), one delivery workflow per topic (owner), a
--sync topic's send in the publishing call (sync), and an endpoint's name resolved and checked
again when a client connects (resolution). What an endpoint may be, checked before a topic may
send to it, is procbus.core.endpoints.

The names below load on first use, so each command pays only for what it uses.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from procbus.delivery.clients import BATCH_ID_HEADER as BATCH_ID_HEADER
    from procbus.delivery.clients import EndpointClient as EndpointClient
    from procbus.delivery.clients import Message as Message
    from procbus.delivery.clients import Outcome as Outcome
    from procbus.delivery.clients import Sent as Sent
    from procbus.delivery.factory import client_for as client_for
    from procbus.delivery.factory import endpoint_check as endpoint_check
    from procbus.delivery.kafka import KafkaRecord as KafkaRecord
    from procbus.delivery.kafka import read_committed as read_committed
    from procbus.delivery.models import DELIVERY_POLL_FIRST_SECONDS as DELIVERY_POLL_FIRST_SECONDS
    from procbus.delivery.models import DELIVERY_POLL_MAX_SECONDS as DELIVERY_POLL_MAX_SECONDS
    from procbus.delivery.models import DeliveryInput as DeliveryInput
    from procbus.delivery.models import DeliveryRequest as DeliveryRequest
    from procbus.delivery.models import DeliveryResult as DeliveryResult
    from procbus.delivery.owner import delivery_workflow_id as delivery_workflow_id
    from procbus.delivery.owner import ensure_delivery as ensure_delivery
    from procbus.delivery.owner import keep_owners as keep_owners
    from procbus.delivery.rounds import DeliveryRounds as DeliveryRounds
    from procbus.delivery.sync import send_now as send_now

# Public name -> the module that defines it.
_MODULE_OF = {
    "BATCH_ID_HEADER": "procbus.delivery.clients",
    "EndpointClient": "procbus.delivery.clients",
    "Message": "procbus.delivery.clients",
    "Outcome": "procbus.delivery.clients",
    "Sent": "procbus.delivery.clients",
    "client_for": "procbus.delivery.factory",
    "endpoint_check": "procbus.delivery.factory",
    "KafkaRecord": "procbus.delivery.kafka",
    "read_committed": "procbus.delivery.kafka",
    "DELIVERY_POLL_FIRST_SECONDS": "procbus.delivery.models",
    "DELIVERY_POLL_MAX_SECONDS": "procbus.delivery.models",
    "DeliveryInput": "procbus.delivery.models",
    "DeliveryRequest": "procbus.delivery.models",
    "DeliveryResult": "procbus.delivery.models",
    "delivery_workflow_id": "procbus.delivery.owner",
    "ensure_delivery": "procbus.delivery.owner",
    "keep_owners": "procbus.delivery.owner",
    "DeliveryRounds": "procbus.delivery.rounds",
    "send_now": "procbus.delivery.sync",
}

__all__ = [
    "BATCH_ID_HEADER",
    "DELIVERY_POLL_FIRST_SECONDS",
    "DELIVERY_POLL_MAX_SECONDS",
    "DeliveryInput",
    "DeliveryRequest",
    "DeliveryResult",
    "DeliveryRounds",
    "EndpointClient",
    "KafkaRecord",
    "Message",
    "Outcome",
    "Sent",
    "client_for",
    "delivery_workflow_id",
    "endpoint_check",
    "ensure_delivery",
    "keep_owners",
    "read_committed",
    "send_now",
]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
