"""The mixed-load soak (bench/soak/run.py; `python -m bench.soak`)."""
