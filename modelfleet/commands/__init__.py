"""The release engineers' commands (`modelfleet models|publish|versions|rollout|status|audit|
devices|login`): HTTP API clients, one module per area; docs/cli.md describes them."""
