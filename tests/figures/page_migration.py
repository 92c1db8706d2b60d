"""The figures of docs/migration.rst: settings, none measured."""

PAGE = "docs/migration.rst"

QUOTES = []

NOT_MEASURED = {
    "0.9": "the example schedule's VALUE",
    "0.5": "nnabla's backoff_factor default, and an example's min_scale",
}
