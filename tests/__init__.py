"""The test suite as a package: modules are imported as ``tests.<area>.<module>`` (no
``sys.path`` edits; shared helpers live in tests.support)."""
