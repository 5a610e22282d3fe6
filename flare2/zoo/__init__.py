"""Stock algorithms and models, each short enough to read top to bottom.

Each algorithm is two modules: ``flare2/zoo/NAME.py``, the Algorithm (torch), and ``flare2/zoo/records/NAME.py``,
its config and the :class:`AlgorithmRecord` that ``flare2 train``, ``flare2 tune`` and ``flare2 eval`` read
(no torch). :func:`register` adds an algorithm of your own to them (``flare2.zoo.registry`` tells how).
"""

from flare2.zoo.record import AlgorithmRecord
from flare2.zoo.registry import lookup, names, register

__all__ = ["AlgorithmRecord", "lookup", "names", "register"]
