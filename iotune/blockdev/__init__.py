"""Block devices as the kernel sees them: names, numbers, stacking.

Naming a device, resolving a path to the device(s) holding it, finding what a
device sits on (a loop device's backing disk, md/dm members), a drive's
identity for the sweep journal and its SMART wear. Imports fs (mountinfo),
model and errors only.
"""
