"""Delta-format test vectors and their generator (python -m tests.delta.vectors.generate)."""
