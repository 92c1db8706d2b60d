"""The figures of docs/migration.rst: settings, none measured; the defaults are read from
the code."""
from figures import ANOTHER, DESIGN, INDEX, NO_SCALE, PRONOUN, Quote, in_code

PAGE = "docs/migration.rst"
#: The limit of recursive calls of nnabla's updater (``_max_recursive_count`` in
#: ``nnabla/experimental/mixed_precision_training.py``).
NNABLA_RECURSION = "nnabla's updater's limit of recursive calls, in its source"

QUOTES = [
    Quote("``min_scale`` (default {min_scale}) and ``max_scale`` (default 2**24)",
          min_scale=in_code("nnabla_mpt/scale/policy.py", "DEFAULT_MIN_SCALE", fmt="{:g}")),
    Quote("After ``diagnose_after`` overflowing steps in a row (default {after})",
          after=in_code("nnabla_mpt/step/overflow_handling.py",
                        "OverflowHandling.diagnose_after")),
]

NOT_MEASURED = {
    '"fast|step|0.9"': "the example schedule's VALUE",
    "``min_scale`` of 0.5": "an example setting",
    "after 100 tries it returns without a word": NNABLA_RECURSION,
    "after 100 recursive tries in one call": NNABLA_RECURSION,
    'bounded "one call = one update" mode': DESIGN,
    "(a ReLU maps NaN to 0)": "what ReLU makes of NaN, zero",
    "A leaf loss, or one that uses none": PRONOUN,
    "(``TypeError`` naming ``data_feeder``); one that returns": PRONOUN,
    "All gradients travel in one ``all_reduce`` call": DESIGN,
    "(never a clip factor of 0)": "a clip factor of zero, which never happens",
    "reproduces the uninterrupted one bitwise": PRONOUN,
    "into the new one)": PRONOUN,
    "(after ``updater.max_retries = 2``, ``updater.overflow.max_retries`` is 2)":
        "an example of an assignment and what it reads back",
    "a file holds one step's parameters and state": DESIGN,
    "those that belong together are one object each": DESIGN,
    "to a value below 1 needs ``min_scale`` lowered": "a scale below the default "
                                                     "min_scale, 1",
    "it runs the graph a second time": ANOTHER,
    "(or the warning on the 1st, 10th, 100th bad batch)": "the bad batches the collapse "
                                                         "watch warns at, its design "
                                                         "(nnabla_mpt/step/collapse.py)",
    "(0 in float16)": "float16's rounding of a value below its smallest subnormal: zero",
    "an armed one makes it refuse to step": PRONOUN,
    "sets its inputs' gradients to 1, whatever the loss scale": "what F.sink's backward "
                                                                "sets, in nnabla's source",
    "moves the batch-normalization statistics a second time": ANOTHER,
    "with a float graph and a scale of 1": NO_SCALE,
    "cifar10 monitors rank 0's": INDEX,
    "then about one every ``N`` steps)": "probe growth's try at each growth point, its "
                                         "definition",
    "its ResNet by one convolution": "the example's model, its design",
    "``create_communicator()`` makes one, and": PRONOUN,
    "the one ``current_communicator()`` returns": PRONOUN,
    "started as one of several": "a process among several, no count",
    'Refused: one group, ``"world"``': DESIGN,
    "or broadcast rank 0's with ``comm.bcast``": INDEX,
}
