"""Test beds that only the tests and benchmarks bring up: the one-machine
multi-node bed (nodes), a real Slurm cluster on it (slurm) and a FUSE
filesystem with known service times and no block device under it (fuse)."""
