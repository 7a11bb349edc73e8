"""iotune: profile and tune storage I/O for LLM training that offloads to NVMe."""

__version__ = "0.1.0"
