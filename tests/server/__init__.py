"""Tests of the server area."""
