"""The application's payload codec: every payload it and procbus send through Temporal, compressed.

An encrypting codec (Temporal's encryption sample, AES-GCM) has the same shape. The worker and
the starter connect with it; procbus's CLI and `procbus worker` are given it by name:
PROCBUS_PAYLOAD_CODEC=codec:SalesCodec.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

from temporalio.api.common.v1 import Payload
from temporalio.converter import PayloadCodec

# How procbus's settings name it, for `Settings(payload_codec=...)` and PROCBUS_PAYLOAD_CODEC.
PAYLOAD_CODEC = "codec:SalesCodec"
ENCODING = b"binary/sales-zlib"


class SalesCodec(PayloadCodec):
    """Each payload, whole (data and metadata), compressed into one of its own encoding."""

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [
            Payload(metadata={"encoding": ENCODING}, data=zlib.compress(p.SerializeToString()))
            for p in payloads
        ]

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        # Payloads of any other encoding pass as they are: the `temporal` CLI sends plain JSON.
        return [
            Payload.FromString(zlib.decompress(p.data))
            if p.metadata.get("encoding") == ENCODING
            else p
            for p in payloads
        ]
