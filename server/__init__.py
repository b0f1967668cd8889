"""ModelFleet release backend: registry API, compile jobs, publishing, rollout control."""
