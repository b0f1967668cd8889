"""Tests of the delta area."""
