"""ModelFleet client SDK: the secure on-device updater and model runtime."""

__version__ = "0.1.0"
