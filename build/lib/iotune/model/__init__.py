"""Plain data: frozen dataclasses with to_json/from_json.

What it may import: the standard library; numpy, for the columnar timeline
(model/timeline.py) and the run file's timeline.npz (model/runfile.py);
and pandas, imported lazily in model/runfile.py only to read a long
timeline.csv with its C parser. Nothing here imports another part of
iotune, nor the packages the other layers are built on (click, rich, plotly,
jsonschema, torch, deepspeed, transformers, bcc): import-linter contracts
in pyproject.toml.
"""
