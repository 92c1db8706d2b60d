"""The figures of docs/gpu.rst: none is measured here (no GPU is at hand)."""
from figures import VERSION

PAGE = "docs/gpu.rst"

QUOTES = []

NOT_MEASURED = {
    "5%": "tools/gpu_check.py's tolerance between the float16 and the float losses",
    "80%": "tools/gpu_check.py's bound on the final loss against the starting loss",
    "60 s": "nnabla-ext-cuda 1.39's watchdog timeout of init, as its source sets it",
    "50 s": "nnabla-ext-cuda 1.39's watchdog timeout of all_reduce on rank 0 (its source)",
    "250 s": "nnabla-ext-cuda 1.39's watchdog timeout of all_reduce on the other ranks",
    "1.39": VERSION,
    "0.02": "tools/gpu_check.py's absolute tolerance between the losses",
    "200 steps": "tools/gpu_check.py's training check, its length",
}
