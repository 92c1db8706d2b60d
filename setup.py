import sys

# nnabla publishes wheels for CPython 3.8-3.10 only; without this check pip would go on to
# look for an nnabla wheel and end with "No matching distribution found for nnabla==...".
if not (3, 8) <= sys.version_info[:2] <= (3, 10):
    sys.exit(
        f"error: nnabla_mpt cannot be installed into Python "
        f"{sys.version_info.major}.{sys.version_info.minor} ({sys.executable}).\n"
        f"It needs nnabla, which publishes wheels for CPython 3.8, 3.9 and 3.10 only.\n"
        f"Install one of them (for example `pyenv install 3.10` or "
        f"`apt-get install python3.10 python3.10-venv`), then install from the checkout "
        f"with it:\n"
        f"  python3.10 -m venv .venv && .venv/bin/python -m pip install .\n"
        f"or run `./run.sh demo` / `./run.sh test`, which find a Python 3.10 and build .venv."
    )

from setuptools import find_packages, setup

setup(
    name="nnabla_mpt",
    version="0.1.0",
    description="Loss scaling for mixed-precision training with nnabla",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["nnabla_mpt", "nnabla_mpt.*"]),
    python_requires=">=3.8,<3.11",
    # The nnabla versions the suite runs on (tox.ini: the oldest and the newest).
    install_requires=["nnabla>=1.36.0,<2", "numpy"],
    extras_require={
        "mpi": ["mpi4py>=3.1", "mpich"],
        "demo": ["scikit-learn", "matplotlib", "tqdm"],
        "test": ["pytest>=7", "hypothesis>=6", "pytest-randomly"],
        "docs": ["sphinx>=5"],
        "plot": ["matplotlib"],
        "tensorboard": ["tensorboardX"],
    },
    license="Apache-2.0",
)
