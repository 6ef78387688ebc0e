"""The client side of principals: every workflow a signing client starts carries a token for
that workflow only (procbus.auth.tokens) in the `procbus-principal` header."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import BaseModel
from temporalio.api.common.v1 import Payload
from temporalio.client import (
    Client,
    Interceptor,
    OutboundInterceptor,
    StartWorkflowInput,
    WorkflowHandle,
)

from procbus.auth import DEV_PRINCIPAL, TOKEN_HEADER, client_key, input_digest, sign, sign_schedule
from procbus.config import Settings
from procbus.errors import ConfigError


@dataclass(frozen=True)
class Signer:
    key: bytes
    principal: str
    seconds: float = 300.0

    def as_principal(self, principal: str) -> Signer:
        return replace(self, principal=principal)

    def header(self, workflow_id: str, workflow_type: str) -> Payload:
        expires_at = datetime.now(UTC) + timedelta(seconds=self.seconds)
        token = sign(self.key, self.principal, workflow_id, workflow_type, expires_at)
        return Payload(metadata={"encoding": b"json/plain"}, data=token.encode())

    def schedule_header(
        self, workflow_id_base: str, workflow_type: str, request: BaseModel | dict[str, Any]
    ) -> Payload:
        """The token for every run of a schedule: its runs' ID base, type and this input (a
        model, or the JSON object of a type this client has no model for)."""
        fields = request.model_dump(mode="json") if isinstance(request, BaseModel) else request
        digest = input_digest(fields)
        token = sign_schedule(self.key, self.principal, workflow_id_base, workflow_type, digest)
        return Payload(metadata={"encoding": b"json/plain"}, data=token.encode())

    def schedule_headers(
        self, workflow_id_base: str, workflow_type: str, request: BaseModel | dict[str, Any]
    ) -> dict[str, Payload]:
        return {TOKEN_HEADER: self.schedule_header(workflow_id_base, workflow_type, request)}


def client_signer(settings: Settings, principal: str | None = None) -> Signer | None:
    """Return who a CLI or starter script signs as; None when there is no one to sign for.

    `principal` (`--as`), else PROCBUS_PRINCIPAL, else the dev operator with the dev stack's
    key.

    Raises:
        ConfigError: when `principal` is given but there is no key to sign with.
    """
    found = client_key(settings.auth_key_bytes, settings.state_dir)
    if found is None:
        if principal is not None:
            raise ConfigError(
                f"cannot start as {principal!r}: no key to sign with (set PROCBUS_AUTH_KEY, or "
                "run against `procbus dev`, whose key is in its state folder)"
            )
        return None
    key, dev = found
    who = principal or settings.principal or (DEV_PRINCIPAL if dev else None)
    if who is None:
        return None  # unauthenticated: the worker decides what that may do
    return Signer(key, who, settings.auth_token_seconds)


class SigningInterceptor(Interceptor):
    def __init__(self, signer: Signer) -> None:
        self.signer = signer

    def intercept_client(self, next: OutboundInterceptor) -> OutboundInterceptor:
        return _SigningOutbound(next, self.signer)


class _SigningOutbound(OutboundInterceptor):
    def __init__(self, next: OutboundInterceptor, signer: Signer) -> None:
        super().__init__(next)
        self.signer = signer

    async def start_workflow(self, input: StartWorkflowInput) -> WorkflowHandle[Any, Any]:
        input.headers = {
            **input.headers,
            TOKEN_HEADER: self.signer.header(input.id, input.workflow),
        }
        return await super().start_workflow(input)


def signed_client(client: Client, signer: Signer) -> Client:
    """Return a client on `client`'s connection that signs every start as `signer`.

    It replaces any other signer.
    """
    config = client.config()
    config["interceptors"] = [
        *(i for i in config["interceptors"] if not isinstance(i, SigningInterceptor)),
        SigningInterceptor(signer),
    ]
    return Client(**config)
