"""The figures of docs/precision.rst: settings, none measured."""
from figures import VERSION

PAGE = "docs/precision.rst"

QUOTES = []

NOT_MEASURED = {
    "nnabla 1.39": VERSION,
    "VALUE in [0.2, 0.9], default 0.9": "the range and default of a step trigger",
    "VALUE in [1.01, 1.5], default 1.05": "the range and default of a loss trigger",
    '``"fast|step|0.90"`` is ``"fast|step|0.9"``': "one schedule written two ways",
    '"fast|step|0.9"``.': "the demo's example schedule",
}
