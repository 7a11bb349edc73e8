"""The BPF probe sources (C) and their shared header, shipped as package
data `iotune.probes`; located with iotune.resources.probes_dir()."""
