"""The figures of docs/api.rst and of the docstrings it renders: none is measured; the
collective timeout's default and the monitor's series are read from the code."""
from figures import DESIGN, HALF, INDEX, NO_SCALE, PRONOUN, Quote, in_code, spelled

PAGE = "docs/api.rst"

QUOTES = [
    Quote("which the others spend waiting. Default {timeout}; None waits forever.",
          timeout=in_code("nnabla_mpt/distributed/collective_timeout.py", "DEFAULT_TIMEOUT",
                          fmt="{:g}")),
    Quote("Every ``interval`` steps it adds one line ``<step index> <value>`` to each of "
          "{window} ``MonitorSeries`` files",
          window=in_code("nnabla_mpt/report/series.py", "WINDOW",
                         lambda series: spelled(len(series)))),
]

NOT_MEASURED = {
    "(3000.7 is 3000 in float16)": "an example of a scale float16 holds only rounded",
    "(3000.7 is 3000.0 in float16": "an example of a scale float16 holds only rounded",
    "``VALUE`` in [0.2, 0.9], default 0.9": "the range and default of a step trigger",
    "``VALUE`` in [1.01, 1.5], default 1.05": "the range and default of a loss trigger",
    '``"fast|step|0.9"``': "an example schedule",
    "as one object each": DESIGN,
    "between one measured gradient": PRONOUN,
    "which sees one batch": "the one batch scale='auto' measures: its design",
    "``step = updater.update()`` runs one step": DESIGN,
    "already filled. One that needs an argument is refused (``TypeError``); one that "
    "returns": PRONOUN,
    "Growth factor of the scale (> 1)": "the bound of a growth factor: above 1, no scaling",
    "None (default) costs one attribute test per step": DESIGN,
    "what is done about one,": PRONOUN,
    "``max_retries`` within one ``update()``": DESIGN,
    "run with scale 1": NO_SCALE,
    "What one call of ``update()`` did": DESIGN,
    "counted from 0 over the updater's life": INDEX,
    "Steps this call ran: 1, or more in retry mode": "the least steps one call runs, one",
    "and the one every measurement": PRONOUN,
    "nnabla's float16 seed is 0": "float16's rounding of a seed below its smallest "
                                  "subnormal value: zero",
    "the same one). 0 (default) returns the skipped step": "the default of max_retries, "
                                                           "none, and a pronoun",
    "(>= 1). A single overflow": "the least number of steps that can trigger the diagnosis",
    "None (default): one all-reduce after the pass": DESIGN,
    "more than one rank": "a condition: several ranks",
    "only the first one installed": PRONOUN,
    "Statistics of one parameter's gradient": DESIGN,
    "The three fractions count disjoint sets": "the fractions GradientStats has (zero, "
                                               "subnormal, non-finite), named just before",
    "``-inf`` for one holding inf or NaN": PRONOUN,
    "``dtype`` is the narrowest one": PRONOUN,
    "it grows by one factor": "probe growth by one factor, its definition",
    "(a scale below one only loses fp16 precision)": NO_SCALE,
    "the same decision with one prebuilt graph": DESIGN,
    "every rank from rank 0's parameters": INDEX,
    "as one buffer, with a fixed number of collectives": DESIGN,
    "computes every element of the sum once, on one rank": DESIGN,
    "when all ranks run on one machine": "a condition: all ranks on a single machine",
    "requires every rank on one machine": "a condition: all ranks on a single machine",
    "any rank between two collectives": "a pause between collectives, no count",
    "an integer type wider than 16 bits": "the width of an integer type, a fact of the dtypes",
    "Args: data: One :class:`nnabla.NdArray` or a list": "the argument's form, a single "
                                                         "array or a list",
    "checked again at scale 1": NO_SCALE,
    "The loss scale of the failing step (> 0)": "the bound of a loss scale, above zero",
    "``scale`` is not finite and > 0, or ``chain_length`` < 1": "the bounds of the "
                                                                "arguments checked",
    "the same batch is finite at scale 1": NO_SCALE,
    "even at scale 1": NO_SCALE,
    "(0-based)": INDEX,
    "a backward pass at scale 1": NO_SCALE,
    "in the backward pass at scale 1": NO_SCALE,
    "Further observations, one sentence each": "the form of the notes",
    "One line: what was found": "the form of the summary",
    '(e.g. "8 consecutive overflowing steps")': "an example reason, with diagnose_after's "
                                                "default, 8",
    "Any callable taking one argument is a hook": "a hook's signature, one argument",
    "This module offers three that summarise": "the module's three hooks, named below it "
                                               "(LossScaleMonitor, LossScaleCallback, "
                                               "LossScaleTensorBoard)",
    "``gradient_stats_every``), three more,": "the gradient series, named in the list "
                                              "below it",
    "(``StepResult.held_by``), one more:": "the held-by-ceiling series, named below it",
    "that is six significant digits": "what ``%g`` writes, a fact of Python",
    "the earlier process left half written": "a line cut off by an interrupted write, no "
                                             "count",
    "it adds one line ``<step index> <value>``": DESIGN,
    "Called with one :class:`LossScaleStats`": DESIGN,
    "A summary of the steps of one window": DESIGN,
    "(the updater's step index, from 0)": INDEX,
    "the steps run at scale 1, which is no loss scale": NO_SCALE,
    "and a new one after a rewind": PRONOUN,
    "(not one given to it)": PRONOUN,
    "the steps of a full one": PRONOUN,
    "per thousand steps covered": "the unit of the share, per thousand",
    "that ran with one (of the windows' last steps": PRONOUN,
    "that ran with one), the most first": PRONOUN,
    "One drawing for two sources": "the figure drawn the same way for the report's two "
                                   "sources (a run's files, a LossScaleReport)",
    "drawing one changes no global state, and a notebook shows the one returned": PRONOUN,
    "Steps per point: 1 when": "a point per step, the finest window",
    "(0 to 1)": "the range of a rate or a fraction",
    "(at 100 dpi": "the resolution draw saves at, a constant of its code",
    "is the last one in reduced precision": PRONOUN,
    "(built under a half context)": HALF,
    "One line for the log": "the form of the log's message",
}
