"""Sphinx configuration for the nnabla_mpt documentation."""
import os
import sys

sys.path.insert(0, os.path.abspath(".."))

project = "nnabla_mpt"
author = "nnabla_mpt authors"
copyright = "2026, nnabla_mpt authors"
release = "0.1.0"

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
]
autodoc_member_order = "bysource"
autodoc_typehints = "description"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
exclude_patterns = ["_build"]
html_theme = "alabaster"
nitpicky = False
