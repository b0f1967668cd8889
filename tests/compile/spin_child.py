"""A stand-in for an HTP graph preparation that never ends (test_htp_child.py): it spins on
the CPU until the limit the parent set stops it."""

while True:
    pass
