"""One compiler per platform behind the `Compiler` protocol (see base.py)."""
