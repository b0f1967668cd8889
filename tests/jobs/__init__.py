"""Tests of the jobs area."""
