"""Tests of the release engineers' CLI (modelfleet/commands) against a real server."""
