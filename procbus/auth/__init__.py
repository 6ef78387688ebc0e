"""Who starts a procedure: principals signed into a Temporal header by the client (HMAC over the
principal, the workflow ID and type, and an expiry: `tokens`) and verified on the worker,
replay-safe, in a local activity whose answer is recorded (`policy`, `models`). Kept light:
`models` is imported by the procedure engine's own models. See docs/security.md."""
