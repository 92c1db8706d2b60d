"""The figures of docs/precision.rst: settings, none measured."""
from figures import DESIGN, HALF, NO_SCALE, PRONOUN, VERSION

PAGE = "docs/precision.rst"

QUOTES = []

NOT_MEASURED = {
    "nnabla 1.39": VERSION,
    "VALUE in [0.2, 0.9], default 0.9": "the range and default of a step trigger",
    "VALUE in [1.01, 1.5], default 1.05": "the range and default of a loss trigger",
    '``"fast|step|0.90"`` is ``"fast|step|0.9"``': "one schedule written two ways",
    '"fast|step|0.9"``.': "the demo's example schedule",
    "the ASCII digits 0-9. One value written differently is one schedule":
        "the digits a VALUE is written with, and the rule that one value is one schedule",
    "builds the network twice, once under the half context": "the schedule's two graphs, "
                                                             "its design; " + HALF,
    "``high_precision_loss`` runs with scale 1": NO_SCALE,
    "``updater.scale`` reads 1 from then on": NO_SCALE,
    "no backend of nnabla 1.39 has one": PRONOUN,
}
