"""Signed publishing: signing keys and roots, the channel manifest builder, the publisher that
signs and stores manifests (one serial per change, per channel), re-signing before expiry,
delta patches, the bucket's read paths and the manifest cache. Which release a channel offers,
to whom and when is server/rollouts/ (which calls the publisher; nothing here calls it).

Pure parts (roots.py, builder.py, records.py) take values and return values; the I/O sits in
keys.py (files), publisher.py (database + blob store) and bucket.py.
"""
