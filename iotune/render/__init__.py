"""Presentation of model records: each renderer turns a record into text.

A renderer is a class with `render(run) -> str` and a `file_extension`;
adding an output format means adding one module here.
"""
