"""Endpoints: where a topic's events go, checked before a topic is created.

    http://host/path, https://...        a webhook: one event per POST, or with ?batch=1 a JSON
                                         array of events per POST
    amqp://user:password@host/vhost?exchange=X&routing_key=Y   (amqps:// too) a RabbitMQ broker
    table://NS, table://NS.TABLE         lake tables: each batch of captured changes applied by a
                                         Spark job and one catalog commit (procbus.pipeline)
    kafka://HOST:PORT[,HOST:PORT]/TOPIC  a Kafka topic: a message per event, keyed by the event's
                                         key; a grouped topic's batch is one Kafka transaction
                                         (?compression=, ?client_id=, ?credentials=NAME naming
                                         an entry of PROCBUS_KAFKA_CREDENTIALS, ?create=1)

PROCBUS_ENDPOINT_ALLOWLIST (hosts and CIDRs, comma-separated), when set, refuses every other
endpoint. Link-local and cloud metadata addresses are refused always: an endpoint must never
reach the machine's own credentials. An IPv6 address that carries an IPv4 one (IPv4-mapped
::ffff:a.b.c.d, IPv4-compatible ::a.b.c.d, 6to4 2002::/16, NAT64 64:ff9b::/96) is checked as
the IPv4 address it reaches, written in the URL or resolved from a name.

Checked here, where a topic is created, the settings are read and the pipeline is planned; a
delivery client checks what a name resolves to when it connects (procbus.delivery.resolution).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Literal, TypeAlias
from urllib.parse import parse_qs, urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from procbus.core.names import validate_name
from procbus.errors import InvalidRequest

MAX_ENDPOINT_LENGTH = 2048
# Names that resolve to a cloud provider's instance metadata service.
METADATA_HOSTS = frozenset(
    {"metadata", "metadata.google.internal", "metadata.goog", "instance-data", "instance-data.ec2"}
)
# Metadata services outside the link-local ranges (Alibaba, AWS over IPv6).
METADATA_ADDRESSES = (
    ipaddress.ip_network("100.100.100.200/32"),
    ipaddress.ip_network("fd00:ec2::254/128"),
)
# IPv6 prefixes whose last 32 bits are an IPv4 address that a connection to them reaches.
NAT64_PREFIX = ipaddress.ip_network("64:ff9b::/96")
IPv4_COMPATIBLE = ipaddress.ip_network("::/96")

IPAddress: TypeAlias = ipaddress.IPv4Address | ipaddress.IPv6Address


class EndpointKind(StrEnum):
    """The kinds of endpoint a topic delivers to, by URL scheme."""

    WEBHOOK = "webhook"  # HTTP POST, Standard Webhooks signatures
    AMQP = "amqp"  # a message to a RabbitMQ exchange, with publisher confirms
    TABLE = "table"  # lake tables of a namespace (procbus.pipeline applies the changes)
    KAFKA = "kafka"  # a Kafka topic, acks=all, through an idempotent or transactional producer


KAFKA_DEFAULT_PORT = 9092
# Kafka's own rule for topic names (its Topic.validate), "." and ".." aside.
KAFKA_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
KAFKA_COMPRESSIONS = ("none", "gzip", "snappy", "lz4", "zstd")
KAFKA_OPTIONS = ("compression", "client_id", "credentials", "create", "partitions", "acks")
_KAFKA_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_BROKER = re.compile(r"^(?P<host>\[[0-9A-Fa-f:.]+\]|[^:\[\]]+)(?::(?P<port>[0-9]{1,5}))?$")


class KafkaCredentials(BaseModel):
    """How procbus logs in to a Kafka cluster: an entry of PROCBUS_KAFKA_CREDENTIALS (JSON, by
    name), which a kafka:// endpoint names with ?credentials=NAME. Never in a URL: topics keep
    their endpoint, and workflow history shows it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    security_protocol: Literal["SASL_SSL", "SASL_PLAINTEXT", "SSL"] = "SASL_SSL"
    sasl_mechanism: Literal["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"] = "SCRAM-SHA-512"
    username: str | None = None
    password: SecretStr | None = None
    ca_location: Path | None = Field(default=None, description="CA certificates (PEM)")
    certificate_location: Path | None = Field(default=None, description="client certificate")
    key_location: Path | None = Field(default=None, description="client private key")


@dataclass(frozen=True)
class KafkaTarget:
    """What a kafka:// endpoint names: its bootstrap brokers, its topic and its options."""

    brokers: tuple[tuple[str, int], ...]  # (host, port), the host lower-cased, IPv6 unbracketed
    topic: str
    compression: str = "none"
    client_id: str = "procbus"
    credentials: str | None = None  # a key of PROCBUS_KAFKA_CREDENTIALS
    create: bool = False  # create the Kafka topic when it does not exist
    partitions: int = 1  # the partitions of a topic created by ?create=1

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(
            f"[{host}]:{port}" if ":" in host else f"{host}:{port}" for host, port in self.brokers
        )


@dataclass(frozen=True)
class Endpoint:
    url: str
    kind: EndpointKind
    host: str
    batch: bool = False  # webhooks: a JSON array of events per POST
    namespace: str | None = None  # table://: the lake namespace
    table: str | None = None  # table://NS.TABLE: the one lake table
    kafka: KafkaTarget | None = None  # kafka://: the brokers, the topic and the options

    @property
    def display(self) -> str:
        """The URL with any password masked, for logs, status and workflow history."""
        return masked(self.url)


def masked(url: str) -> str:
    """Return `url` with its password, if any, replaced by ***."""
    parts = urlsplit(url)
    try:
        if parts.password is None:
            return url
    except ValueError:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{netloc}"))


def parse_allowlist(text: str | None) -> list[str]:
    """Return the allowed hosts and CIDRs of PROCBUS_ENDPOINT_ALLOWLIST; [] when it is unset.

    Raises:
        ValueError: when an entry is neither a host name nor a CIDR.
    """
    entries = [entry.strip().lower() for entry in (text or "").split(",") if entry.strip()]
    for entry in entries:
        if "/" in entry:
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError:
                raise ValueError(f"{entry!r} is neither a host name nor a CIDR") from None
    return entries


def embedded_ipv4(address: IPAddress) -> IPAddress:
    """The IPv4 address an IPv6 address carries (IPv4-mapped, IPv4-compatible, 6to4, NAT64),
    else the address itself: every check must look at where a connection really goes."""
    if isinstance(address, ipaddress.IPv4Address):
        return address
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address in NAT64_PREFIX:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    # ::a.b.c.d, but not :: or ::1 (unspecified and loopback in IPv6 itself).
    if address in IPv4_COMPATIBLE and int(address) > 1:
        return ipaddress.IPv4Address(int(address))
    return address


def literal_address(host: str) -> IPAddress | None:
    """Return the address a literal host reaches (an embedded IPv4 address unwrapped).

    None for a name.
    """
    try:
        return embedded_ipv4(ipaddress.ip_address(host))
    except ValueError:
        return None


def refused_address(host: str) -> str | None:
    """Say why an endpoint host is refused whatever the allowlist says, or return None."""
    if host in METADATA_HOSTS:
        return "it names a cloud metadata service"
    try:
        written = ipaddress.ip_address(host)
    except ValueError:
        return None
    address = embedded_ipv4(written)
    # Say what it carries: [::ffff:169.254.169.254] is refused as 169.254.169.254.
    carries = "" if address == written else f" ({host} carries {address})"
    if address.is_link_local or any(address in network for network in METADATA_ADDRESSES):
        return f"it is a link-local or cloud metadata address{carries}"
    if address.is_unspecified or address.is_multicast:
        return f"it is not a single host{carries}"
    return None


def allowed(host: str, allowlist: list[str]) -> bool:
    """Return whether `host` may be sent to under `allowlist` (an empty list allows every host).

    Args:
        host: a host name or literal IP address.
        allowlist: host names and CIDR networks.
    """
    if not allowlist:
        return True
    address = literal_address(host)
    for entry in allowlist:
        if "/" in entry:
            if address is not None and address in ipaddress.ip_network(entry, strict=False):
                return True
        elif address is not None:
            # An address matches the same address written otherwise (::ffff:10.0.0.5, 10.0.0.5).
            if literal_address(entry) == address:
                return True
        elif host == entry or host.endswith("." + entry):
            return True
    return False


def parse_endpoint(url: str, allowlist: list[str] | None = None) -> Endpoint:
    """Check an endpoint URL; InvalidRequest saying what is wrong with it (its password
    masked)."""
    shown = masked(url)
    if not url or len(url) > MAX_ENDPOINT_LENGTH:
        raise InvalidRequest(f"the endpoint URL is empty or longer than {MAX_ENDPOINT_LENGTH}")
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "table":
        return _table_endpoint(url, parts.netloc, parts.path + parts.query)
    if scheme == "kafka":
        return _kafka_endpoint(url, parts.netloc, parts.path, parts.query, allowlist or [])
    if scheme in ("http", "https"):
        kind = EndpointKind.WEBHOOK
    elif scheme in ("amqp", "amqps"):
        kind = EndpointKind.AMQP
    else:
        raise InvalidRequest(
            f"endpoint {shown!r}: the scheme must be http, https, amqp, amqps, kafka or table, not "
            f"{parts.scheme or '(none)'!r}"
        )
    try:
        host = (parts.hostname or "").lower()
        parts.port  # noqa: B018  # raises on a port that is not a number
    except ValueError:
        raise InvalidRequest(f"endpoint {shown!r}: the port is not a number") from None
    if not host:
        raise InvalidRequest(f"endpoint {shown!r} names no host")
    _check_host(shown, host, allowlist or [])
    query = parse_qs(parts.query)
    batch = query.get("batch", ["0"])[-1] in ("1", "true")
    if kind is EndpointKind.AMQP and not query.get("exchange") and not query.get("routing_key"):
        raise InvalidRequest(
            f"endpoint {shown!r}: an AMQP endpoint needs ?exchange=NAME and/or ?routing_key=KEY"
        )
    return Endpoint(url=url, kind=kind, host=host, batch=batch)


def _check_host(shown: str, host: str, allowlist: list[str]) -> None:
    refusal = refused_address(host)
    if refusal is not None:
        raise InvalidRequest(f"endpoint {shown!r} is refused: {refusal}")
    if not allowed(host, allowlist):
        raise InvalidRequest(
            f"endpoint {shown!r} is refused: {host} is not in PROCBUS_ENDPOINT_ALLOWLIST"
        )


def endpoint_refused(topic: str, refusal: InvalidRequest) -> str:
    """Say why a topic's delivery stopped when its stored endpoint is refused now, and what to do.

    The allowlist changed, or the URL no longer passes the checks.
    """
    return (
        f"delivery stopped: {refusal}. Its events stay queued: once the workers accept the "
        f"endpoint (PROCBUS_ENDPOINT_ALLOWLIST), run `procbus topic enable {topic}`"
    )


def _table_endpoint(url: str, target: str, rest: str) -> Endpoint:
    """table://NS (each source table to the lake table of its name in NS) or table://NS.TABLE."""
    if rest.strip("/"):
        raise InvalidRequest(f"endpoint {url!r}: expected table://NAMESPACE or table://NS.TABLE")
    namespace, dot, table = target.partition(".")
    if not namespace:
        raise InvalidRequest(f"endpoint {url!r} names no namespace: table://NAMESPACE[.TABLE]")
    validate_name("namespace", namespace)
    if dot:
        validate_name("table", table)
    return Endpoint(
        url=url,
        kind=EndpointKind.TABLE,
        host=namespace,
        batch=True,
        namespace=namespace,
        table=table or None,
    )


def _kafka_endpoint(url: str, netloc: str, path: str, query: str, allowlist: list[str]) -> Endpoint:
    """kafka://HOST:PORT[,HOST:PORT]/TOPIC?options: every broker checked as any endpoint host."""
    shown = masked(url)
    if "@" in netloc:
        raise InvalidRequest(
            f"endpoint {shown!r}: a Kafka login goes in PROCBUS_KAFKA_CREDENTIALS, named by "
            "?credentials=NAME, never in the URL (topics keep it, and history shows it)"
        )
    brokers: list[tuple[str, int]] = []
    for written in netloc.split(","):
        match = _BROKER.fullmatch(written.strip())
        port = int(match["port"]) if match and match["port"] else KAFKA_DEFAULT_PORT
        if match is None or not 0 < port < 65536:
            raise InvalidRequest(
                f"endpoint {shown!r}: {written!r} is not a broker: kafka://HOST:PORT[,HOST:PORT]"
                "/TOPIC"
            )
        host = match["host"].strip("[]").lower()
        _check_host(shown, host, allowlist)
        brokers.append((host, port))
    topic = path.removeprefix("/")
    if not KAFKA_TOPIC.fullmatch(topic) or topic in (".", ".."):
        raise InvalidRequest(
            f"endpoint {shown!r}: {topic or '(none)'!r} is not a Kafka topic name (1-249 of "
            "A-Z a-z 0-9 . _ -): kafka://HOST:PORT/TOPIC"
        )
    options = {name: values[-1] for name, values in parse_qs(query, keep_blank_values=True).items()}
    unknown = sorted(set(options) - set(KAFKA_OPTIONS))
    if unknown:
        raise InvalidRequest(
            f"endpoint {shown!r}: unknown option {unknown[0]!r}; a Kafka endpoint takes "
            f"{', '.join(KAFKA_OPTIONS)}"
        )
    if options.get("acks", "all") != "all":
        raise InvalidRequest(
            f"endpoint {shown!r}: acks is always all (an event counts as delivered only once "
            "every in-sync replica has it)"
        )
    compression = options.get("compression", "none")
    if compression not in KAFKA_COMPRESSIONS:
        raise InvalidRequest(
            f"endpoint {shown!r}: compression must be one of {', '.join(KAFKA_COMPRESSIONS)}"
        )
    for name in ("client_id", "credentials"):
        if name in options and not _KAFKA_NAME.fullmatch(options[name]):
            raise InvalidRequest(
                f"endpoint {shown!r}: {name} must be 1-100 of A-Z a-z 0-9 . _ -, starting with "
                "a letter or digit"
            )
    create = options.get("create", "0")
    if create not in ("0", "1", "true", "false"):
        raise InvalidRequest(f"endpoint {shown!r}: create must be 1 or 0")
    partitions = options.get("partitions", "1")
    if not partitions.isdigit() or not 1 <= int(partitions) <= 10_000:
        raise InvalidRequest(f"endpoint {shown!r}: partitions must be a number from 1 to 10000")
    return Endpoint(
        url=url,
        kind=EndpointKind.KAFKA,
        host=brokers[0][0],
        batch=True,  # a batch of events per send, each its own Kafka message
        kafka=KafkaTarget(
            brokers=tuple(brokers),
            topic=topic,
            compression=compression,
            client_id=options.get("client_id", "procbus"),
            credentials=options.get("credentials"),
            create=create in ("1", "true"),
            partitions=int(partitions),
        ),
    )
