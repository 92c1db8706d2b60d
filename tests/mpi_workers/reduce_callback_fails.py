"""An armed all-reduce that fails inside nnabla's solver hook (the ranks arm arrays of
different sizes): the job must end before the update, whose marker file must not appear."""
import sys
from pathlib import Path

import numpy as np

import nnabla as nn
import nnabla.functions as F
import nnabla.parametric_functions as PF
import nnabla.solvers as S

from nnabla_mpt import MPICommunicator

outdir = Path(sys.argv[1])
comm = MPICommunicator()
x = nn.Variable.from_numpy_array(np.ones((2, 3), dtype=np.float32))
loss = F.mean(PF.affine(x, 2 + comm.rank, name="fc"))      # other shapes on each rank
solver = S.Sgd(0.1)
solver.set_parameters(nn.get_parameters())
loss.forward()
loss.backward(communicator_callbacks=comm.all_reduce_callback(
    [v.grad for v in nn.get_parameters().values()], 1024))
solver.update()
(outdir / f"updated{comm.rank}").write_text("the update ran")
