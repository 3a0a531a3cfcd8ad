"""Where results go: the run directory and its record store, provenance, progress bars, and the torchrun world."""
