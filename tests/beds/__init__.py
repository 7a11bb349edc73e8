"""Test beds that only the tests and benchmarks bring up: the one-machine
multi-node bed (nodes) and a real Slurm cluster on it (slurm)."""
