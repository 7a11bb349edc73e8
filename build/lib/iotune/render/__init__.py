"""Presentation of model records: all output iotune prints.

The contract is in base.py (Renderer: `render(record) -> str` with
`record_type`, `format` and `file_extension`); every renderer is listed in
registry.py, keyed by (record type, format). Adding an output format means
adding a Renderer and one entry there.
"""
