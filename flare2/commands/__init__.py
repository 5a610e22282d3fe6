"""The user commands: flare2 train, eval, plot, tune and attach."""
