"""The figures of docs/precision.rst: settings, none measured."""
from figures import VERSION

PAGE = "docs/precision.rst"

QUOTES = []

NOT_MEASURED = {
    "1.39": VERSION,
    "0.2": "the least VALUE of a step trigger",
    "0.9": "the default VALUE of a step trigger, and the examples' schedule",
    "0.90": "an example of one schedule written two ways",
    "1.01": "the least VALUE of a loss trigger",
    "1.5": "the largest VALUE of a loss trigger",
    "1.05": "the default VALUE of a loss trigger",
}
