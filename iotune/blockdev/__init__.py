"""Block devices as the kernel sees them: names, numbers, stacking.

A low layer (imports only `model` and `errors`) shared by trace/ and, later,
volumes/: naming a device, resolving a path to the device(s) holding it, and
finding what a device sits on (a loop device's backing disk, md/dm members).
"""
