"""Gates a compiled artifact must pass before it ships: operators, numerics (see modules)."""
