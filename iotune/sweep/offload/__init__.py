"""`iotune sweep offload`: the whole offload block of the user's job, within the host's memory."""
