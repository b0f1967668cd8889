"""Tests of the manifests area."""
