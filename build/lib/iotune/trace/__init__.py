"""Block-layer tracing: the only part of iotune that imports bcc."""
