"""Rollouts: a release of a model version on a channel, and every change to it.

- `service.py`: channels and rollout changes (start, ramp, pause, resume, halt, promote,
  pin), each audited and published as one new signed manifest (server/publish/publisher.py).
- `rules.py`: what needs no I/O — percentages, filters, state transitions, ramp schedules.
- `preview.py`: which devices a rollout reaches, by the contract's own rule.
- `health.py`: a rollout's health from what devices reported (the votes that count).
- `guard.py`: the halt and promote decisions taken from that health.
- `ramp.py`: stepping a healthy rollout along its ramp schedule.
"""
