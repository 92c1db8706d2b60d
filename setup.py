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
        "test": ["pytest>=7", "hypothesis>=6"],
        "docs": ["sphinx>=5"],
    },
    license="Apache-2.0",
)
