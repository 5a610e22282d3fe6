"""See the package docstring of flare2 for the public names."""
