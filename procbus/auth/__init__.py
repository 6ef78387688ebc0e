"""Who starts a procedure: principals signed into a Temporal header by the client (HMAC over the
principal, the workflow ID and type, and an expiry: `tokens`) and verified on the worker,
replay-safe, in a local activity whose answer is recorded (`policy`; the request and the answer
are procbus.core.authentication, which the procedure engine's own models hold). `keys`: where
the signing key lives; `uses`: a token's one use. See docs/security.md."""
