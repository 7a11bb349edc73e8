"""Plain data: frozen dataclasses with to_json/from_json, stdlib only.

Nothing here imports another part of iotune.
"""
