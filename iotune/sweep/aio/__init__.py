"""`iotune sweep aio` (and `layouts`, `netfs`, every node): DeepSpeed's aio block for a drive, measured with fio or
DeepSpeed's own aio handle and confirmed on training steps."""
