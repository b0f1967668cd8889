"""Compile job queue: interface (server.jobs.interface) and its implementations."""
