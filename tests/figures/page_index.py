"""The figures of docs/index.rst: none is measured."""
from figures import DESIGN

PAGE = "docs/index.rst"

QUOTES = []

NOT_MEASURED = {
    "that own one training step": DESIGN,
}
