"""What an operator watches: Prometheus metrics (`metrics`) and structured logs with request
ids (`logs`). Imports nothing else of ours, so every layer may record to it."""
