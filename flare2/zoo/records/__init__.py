"""One module per zoo algorithm: its config and its :class:`~flare2.zoo.record.AlgorithmRecord` (``RECORD``),
without torch. ``flare2.zoo.registry`` imports every module here; the implementations are ``flare2/zoo/NAME.py``."""
