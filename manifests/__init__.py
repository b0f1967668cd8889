"""ModelFleet's signed manifest contract: documents, DSSE envelopes, trust rules, rollout rule."""
