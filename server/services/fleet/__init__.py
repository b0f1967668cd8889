"""The fleet side of issue 12: device enrolment and revocation (`identity`), signed telemetry
ingestion (`reports` parses, `ingest` verifies and stores), rollout health (`health`) and the
per-rollout guard that halts or promotes a release from what devices report (`guard`).
The wire contract is docs/shadow.md."""
