"""Presentation of model records: all output iotune prints.

A renderer is a function `(record, RenderOptions) -> str` (base.py); every
one is listed in registry.py, keyed by (record type, format). Adding an
output format means writing that function and adding one entry there.
"""
