"""The figures of docs/gpu.rst: none is measured here (no GPU is at hand); the GPU check's
sizes, tolerance and exit status are read from tools/gpu_check.py."""
from figures import DESIGN, HALF, INDEX, PRONOUN, VERSION, Quote, in_code

PAGE = "docs/gpu.rst"
CHECK = "tools/gpu_check.py"

QUOTES = [
    Quote("exits with status 1 if a check failed, {nothing} if nothing was checked",
          nothing=in_code(CHECK, "NOTHING_CHECKED")),
    Quote("(it must say what it needs and exit {nothing})",
          nothing=in_code(CHECK, "NOTHING_CHECKED")),
    Quote("``clip_grad_norm`` on one float16 layer of {weights} weights",
          weights=in_code(CHECK, "SIZES", lambda sizes: round(sizes["clip_width"] ** 2 / 1e6),
                          fmt="{} million")),
    Quote("(relative error at most {rtol})",
          rtol=in_code(CHECK, "CLIP_RTOL", lambda rtol: f"{rtol:.0e}".replace("e-0", "e-"))),
    Quote("an MLP trained {steps} steps in float16 with ``scale=\"auto\", "
          "growth_mode=\"measured\"`` and {steps} in float",
          steps=in_code(CHECK, "SIZES", lambda sizes: sizes["train_steps"])),
]

NOT_MEASURED = {
    "within 5% + 0.02": "tools/gpu_check.py's tolerance between the float16 and the float "
                        "losses",
    "below 80% of the starting loss": "tools/gpu_check.py's bound on the final loss",
    "nnabla-ext-cuda 1.39": VERSION,
    "(60 s) and ``all_reduce`` (50 s on rank 0, 250 s on the others)":
        "nnabla-ext-cuda 1.39's watchdog timeouts, as its source sets them",
    "waits for every other rank with 50 s, so a pause of more than 50 s":
        "the same timeout of rank 0",
    "the other ranks wait with 250 s": "the same timeout of the other ranks",
    "checks the most important of these in one command": "the single command, named next",
    "as one process (no ``mpirun``)": "how the check runs, a single process",
    "It prints one line per check": "the form of the check's output",
    "exits with status 1 if a check failed": "the exit status of a failed check "
                                             "(tools/gpu_check.py's exit_status)",
    "and 0 only when checks passed": "the exit status of a pass (tools/gpu_check.py's "
                                     "exit_status)",
    "on another GPU than 0": INDEX,
    "written on machines without one": PRONOUN,
    "while two updaters are built and step": "the check's two updaters, its design",
    "(with one, device 0 is also the default": "a machine of a single GPU; " + INDEX,
    "on one float16 layer of": "the check's single layer, its design",
    "with one process: ``communicator_dtype_*``": "how the check runs, a single process",
    "with the float16 one,": PRONOUN,
    "one all-reduce of two arrays at construction, one of one array per good step, one more "
    "on a skipped step": DESIGN,
    "needs more than one process": "a condition: several processes",
    "the two open questions below": "the two questions the page names next",
    "A script for one process per GPU": DESIGN,
    "This one needs GPUs": PRONOUN,
    "every rank's model would live on GPU 0": INDEX,
    "returns None for one process": "a job of a single process",
    "stand in for the two ``mixed_half`` contexts": "the two contexts the sentence names "
                                                    "(cudnn and cuda)",
    "that one is registered for": PRONOUN,
    "The float16 one casts every array it reduces to float16 in place, the float32 one":
        PRONOUN,
    "**cuda:half**": HALF,
    "tests all three)": "the three communicators of the table above",
    "* - half - float (recommended)": HALF,
    "* - half - half - the sums are float16": HALF,
    "``log2(ranks)`` factors of 2 lower": "the growth factor 2",
    "* - float - half - the float32 gradients": HALF,
    "for half precision (NCCL's sources": HALF,
    "one byte per element (0 to 255, exact in float16)": "the range of a byte, a fact of "
                                                        "the format",
    "its four bytes in its slot": "the size of a float32, a fact of the format",
    "cuda's ``mixed_half`` one,": PRONOUN,
    "exact for one rank": "a job of a single rank",
    "(exact in float16 up to 2048 ranks)": "float16's largest run of exact integers, 2**11",
    "by one all-reduce of a float32 and a float16 array": DESIGN,
    "Each reads back one small array where it runs": DESIGN,
    "packed into one float32 array in that context (one concatenation on the device), "
    "reduced in one call (a half communicator": DESIGN + "; " + HALF,
    "in nnabla-ext-cuda, one reduction and one host synchronisation per parameter":
        "what nnabla-ext-cuda's check does, its source",
    "(one graph, one host read a step)": DESIGN,
    "the overflow check (one, above)": DESIGN,
    "each micro-batch's loss (one value each)": DESIGN,
    "the norm (one value every good step)": DESIGN,
    "statistics, one small array each": DESIGN,
    "that a half-precision pass made": HALF,
    "runs, for each array, one blocking MPI all-reduce (to check that the array was "
    "written) and one NCCL all-reduce": "what nnabla's communicator does, its source",
    "the same MPI check per array and one NCCL call": "what nnabla's communicator does, "
                                                      "its source",
    "hand it one packed array a step: one MPI check and one NCCL call": DESIGN,
    "the step's flags then take one more call": DESIGN,
    "not only rank 0's": INDEX,
    "Rank 0 waits": INDEX,
    "any other rank between two all-reduces": "a pause between all-reduces, no count",
    "trips rank 0's watchdog": INDEX,
    "a pause of rank 0 longer": INDEX,
    "replaces every one of these timeouts with one value": PRONOUN + "; a single value",
    "any rank between two all-reduces": "a pause between all-reduces, no count",
    "more than one rank": "a condition: several ranks",
    "(NVIDIA/nccl#434)": "the number of NCCL's issue",
}
