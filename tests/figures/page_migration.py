"""The figures of docs/migration.rst: settings, none measured."""

PAGE = "docs/migration.rst"

QUOTES = []

NOT_MEASURED = {
    '"fast|step|0.9"': "the example schedule's VALUE",
    "``min_scale`` of 0.5": "an example setting",
}
