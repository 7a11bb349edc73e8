"""Named sweep profiles (NAME.toml), shipped as package data
`iotune.profiles`; located with iotune.resources.profiles_dir()."""
