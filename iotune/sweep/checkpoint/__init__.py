"""`iotune sweep checkpoint`: how the user's job saves and loads its checkpoints, restore checked."""
