"""Facts about the floating-point types the gradients live in.

Pure Python (no nnabla, no NumPy): the policies import it.
"""

#: The largest finite float16 value.
FP16_MAX = 65504.0
