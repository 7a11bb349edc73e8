"""This machine's processes and what iotune makes on it: running system
commands (proc), the ledger that records what iotune creates and the undo
recipe of each kind of thing, so a killed run's leftovers are reclaimed
(ledger, undo), and
throttled blkio cgroups (cgroup). Imports fs (mountinfo) and errors only.
"""
