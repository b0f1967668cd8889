"""A stand-in for the HTP child that answers with its own environment (test_htp_child.py):
`o0` the variables' names, `o1` their values."""

import os
import sys
from pathlib import Path

import numpy as np

job = Path(sys.argv[1])
np.savez(job / "out.npz", o0=np.array(sorted(os.environ)), o1=np.array(
    [os.environ[k] for k in sorted(os.environ)]))
