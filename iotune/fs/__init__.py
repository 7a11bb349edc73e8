"""Mounts and filesystems as the kernel shows them: the one mountinfo reader,
whether a directory takes O_DIRECT, and network/parallel filesystem clients
with their knobs. The lowest system-facing layer: imports model and errors.
"""
