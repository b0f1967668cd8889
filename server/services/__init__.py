"""Business logic of the server, one module per domain; routes stay thin and call these."""
