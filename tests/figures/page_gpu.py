"""The figures of docs/gpu.rst: none is measured here (no GPU is at hand)."""
from figures import VERSION

PAGE = "docs/gpu.rst"

QUOTES = []

NOT_MEASURED = {
    "within 5% + 0.02": "tools/gpu_check.py's tolerance between the float16 and the float "
                        "losses",
    "below 80% of the starting loss": "tools/gpu_check.py's bound on the final loss",
    "trained 200 steps": "tools/gpu_check.py's training check, its length",
    "nnabla-ext-cuda 1.39": VERSION,
    "(60 s) and ``all_reduce`` (50 s on rank 0, 250 s on the others)":
        "nnabla-ext-cuda 1.39's watchdog timeouts, as its source sets them",
    "waits for every other rank with 50 s, so a pause of more than 50 s":
        "the same timeout of rank 0",
    "the other ranks wait with 250 s": "the same timeout of the other ranks",
}
