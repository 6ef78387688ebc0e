"""Delivery: endpoint clients behind one small interface (webhooks, AMQP), and the checks an
endpoint passes before a topic may send to it."""

from procbus.delivery.endpoints import Endpoint, EndpointKind, parse_allowlist, parse_endpoint

__all__ = ["Endpoint", "EndpointKind", "parse_allowlist", "parse_endpoint"]
