"""Helpers shared by the test areas and by scripts: import them as ``tests.support.<module>``
(the repository root is on ``sys.path`` under pytest and for ``python -m`` runs)."""
