"""Stock algorithms and models, each short enough to read top to bottom."""
