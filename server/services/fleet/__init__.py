"""The fleet side of issue 12: device enrolment and revocation (`identity`), signed telemetry
ingestion (`reports` parses, `ingest` verifies and stores) and the batch path that feeds the
rollouts' guard and ramp (`service.Fleet`). Rollout health and the guard that halts or
promotes a release from what devices report are server/rollouts/ (`health`, `guard`).
The wire contract is docs/shadow.md."""
