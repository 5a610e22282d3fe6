"""Turn-based games of the PettingZoo AEC API, small enough to check by hand, for the tests of flare2's agents."""
