"""Small helpers shared by the MPI worker scripts."""
import json
from pathlib import Path

import numpy as np


def save(outdir, rank, arrays, meta, stem="rank"):
    np.savez(Path(outdir) / f"{stem}{rank}.npz", **arrays)
    (Path(outdir) / f"{stem}{rank}.json").write_text(json.dumps(meta))


def ndarray(values, dtype=np.float32):
    """An nnabla NdArray holding ``values`` in ``dtype`` (float16 via an in-place cast)."""
    import nnabla as nn
    a = nn.NdArray(np.shape(values))
    a.cast(dtype)[...] = values
    return a


def collected_warnings():
    """A list that from now on collects the messages nnabla's logger warns with."""
    import logging
    from nnabla.logger import logger
    seen = []

    class Collect(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    logger.addHandler(Collect(level=logging.WARNING))
    return seen
