"""Delta patch benchmark: generated model pairs, our algorithms vs bsdiff4, zstd, xdelta3."""
