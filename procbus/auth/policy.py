"""What a worker trusts: its key, who runs unauthenticated starts, who the operator is."""

from __future__ import annotations

from dataclasses import dataclass

from procbus.auth.tokens import VerifiedToken, verify
from procbus.auth.uses import KEPT_PAST_EXPIRY_SECONDS
from procbus.core import Authentication, AuthRequest
from procbus.errors import AccessDenied
from procbus.lakehouse import TableDescriptor
from procbus.lakehouse.cache import AccessCache
from procbus.lakehouse.models import AccessEntry, Permission


@dataclass(frozen=True)
class WorkerAuth:
    """The default refuses every unauthenticated start and verifies no token (no key). A worker
    builds its own from the settings (procbus.plugin.extension: worker_auth, dev_worker_auth)."""

    key: bytes | None = None
    unauthenticated_principal: str | None = None
    operator_principal: str | None = None
    # How long past its token's expiry a start accepted in time may still be verified; its
    # token's one use is remembered exactly that long (procbus.auth.uses).
    late_seconds: float = KEPT_PAST_EXPIRY_SECONDS

    def is_operator(self, principal: str | None) -> bool:
        return principal is not None and principal == self.operator_principal

    def authenticate(self, request: AuthRequest) -> tuple[Authentication, VerifiedToken | None]:
        """Who a start runs as, and the token that says so (whose one use the caller claims)."""
        if request.token is None:
            principal = self.unauthenticated_principal
            unauthenticated = Authentication(
                principal=principal,
                method="unauthenticated" if principal else "none",
                operator=self.is_operator(principal),
            )
            return unauthenticated, None
        if self.key is None:
            no_key = Authentication(
                principal=None,
                method="none",
                refusal="the start carries a principal token, but this worker has no "
                "PROCBUS_AUTH_KEY to verify it",
            )
            return no_key, None
        try:
            verified = verify(
                self.key,
                request.token,
                request.workflow_id,
                request.workflow_type,
                request.started_at,
                request.input_sha256,
            )
        except AccessDenied as refused:
            return Authentication(principal=None, method="none", refusal=str(refused)), None
        found = Authentication(
            principal=verified.principal,
            method="token",
            operator=self.is_operator(verified.principal),
        )
        return found, verified

    def require(self, access: AccessCache, entry: AccessEntry) -> None:
        """AccessDenied unless `entry` is in this worker's ACL cache or names the operator."""
        if not self.is_operator(entry.principal):
            access.require(entry)

    def require_write(
        self, access: AccessCache, principal: str | None, table: TableDescriptor
    ) -> None:
        """AccessDenied unless `principal` may change `table`'s data on this worker."""
        if principal is None:  # the engine refuses such a start before any step
            raise AccessDenied(f"no principal to check for write on {table.qualified_name!r}")
        self.require(
            access,
            AccessEntry(
                principal=principal,
                namespace=table.namespace,
                table=table.name,
                permission=Permission.WRITE,
            ),
        )


# The benchmarks' workers: what they start runs unauthenticated, as an all-powerful principal.
BENCH_AUTH = WorkerAuth(unauthenticated_principal="bench", operator_principal="bench")
