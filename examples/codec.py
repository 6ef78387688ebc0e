"""A payload codec of a user's own, with ProcbusPlugin on the client that uses it.

The codec compresses; an encrypting one (Temporal's encryption sample, AES-GCM) has the same
shape: `encode` turns each payload into one with its own encoding, `decode` turns it back and
leaves payloads of any other encoding as they are. procbus's payloads go through it like yours.
`PROCBUS_PAYLOAD_CODEC=examples.codec:CompressionCodec` gives procbus's CLI the same codec.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

from temporalio.api.common.v1 import Payload
from temporalio.client import Client
from temporalio.converter import DataConverter, PayloadCodec

from procbus import ProcbusPlugin, Settings

# --8<-- [start:codec]
ENCODING = b"binary/zlib"


class CompressionCodec(PayloadCodec):
    """Each payload, whole (data and metadata), compressed into one of encoding binary/zlib."""

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [
            Payload(metadata={"encoding": ENCODING}, data=zlib.compress(p.SerializeToString()))
            for p in payloads
        ]

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [
            Payload.FromString(zlib.decompress(p.data))
            if p.metadata.get("encoding") == ENCODING
            else p
            for p in payloads
        ]


# --8<-- [end:codec]


# --8<-- [start:connect]
async def connect(address: str, settings: Settings) -> Client:
    """A client whose payloads, procbus's included, go through the codec."""
    return await Client.connect(
        address,
        data_converter=DataConverter(payload_codec=CompressionCodec()),
        plugins=[ProcbusPlugin(settings)],
    )


# --8<-- [end:connect]
