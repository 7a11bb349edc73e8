"""This machine's processes and what iotune makes on it: running system
commands (proc), the kinds of things iotune creates and the ledger that
records them so a killed run's leftovers are reclaimed (kinds, ledger), and
throttled blkio cgroups (cgroup). Imports fs (mountinfo) and errors only.
"""
