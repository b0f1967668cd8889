"""`python -m bench.soak`: the mixed-load soak (bench/soak/run.py)."""

from bench.soak.run import main

main()
