"""See flare2.runtime for the layout."""
