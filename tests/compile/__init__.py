"""Tests of the compile area."""
