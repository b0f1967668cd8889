"""Signed publishing: signing keys and roots, the channel manifest builder, the publisher that
signs and stores manifests (serial per channel), re-signing before expiry, rollout control.

Pure parts (roots.py, rules.py, builder.py, records.py) take values and return values; the
I/O sits in keys.py (files), publisher.py and rollouts.py (database + blob store).
"""
