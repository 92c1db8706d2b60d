"""The all-reduce that training scripts ask to run "during the backward pass", on the CPU.

nnabla's ``loss.backward(communicator_callbacks=...)`` runs callbacks made by nnabla's C++
communicators (NCCL, on GPUs): they all-reduce packs of gradients while the backward pass
goes on. It accepts no other kind of object (a Python one raises ``TypeError``), so a
communicator written in Python cannot run inside the pass; what it also accepts is
``None``, "no callback".

:meth:`MPICommunicator.all_reduce_callback` therefore returns ``None`` and arms
the communicator's reduction: the reduction of the given arrays runs right before the next
solver operation that follows a pass of a graph (``update``, ``weight_decay``,
``clip_grad_by_norm``, ``scale_grad``, ``check_inf_or_nan_grad``, ...; not
``zero_grad``), through nnabla's process-wide hooks (``nnabla.callback``). The solver sees
the gradients bit for bit as an ``all_reduce`` right after the backward pass gives them:
it is that call, made a little later. On the CPU nothing would run alongside the backward
pass anyway (``benchmarks/all_reduce_callback.py`` measures both routes).

How it differs from nnabla's callback (the distributed page tells users the same):

* until the first solver operation the gradients are still this rank's own;
* every armed array is reduced, not only those the backward pass reached;
* a communicator holds one armed reduction: a later call replaces the arrays of an
  earlier one. It stays armed until ``clear_all_reduce_callback()``, so a callback made
  once and passed to every backward pass works as one made for each pass: for that,
  nnabla's function hook, a Python call for every function of every pass, tells that a
  pass ran (a script that arms for each pass drops it after its first step);
* the hooks are process-wide: the next operation of any solver runs a due reduction, and
  while the function hook is in place, a pass of any graph makes one due;
* nnabla carries on with the solver's operation when a hook raises, so a failed reduction
  ends the job (``MPI_Abort``) instead of letting the parameters move by this rank's own
  gradients.
"""
import traceback
from typing import Any, List, Optional, Sequence, Union

import nnabla as nn
from nnabla import callback
from nnabla.logger import logger

from ..core import _validate as check
from ._collective_args import check_group, ndarray_list
from .abort import hard_abort


class AllReduceCallback:
    """``all_reduce_callback`` and its companions, for :class:`MPICommunicator`, and the
    reduction they arm (MPICommunicator holds ``_comm``, ``rank`` and ``size``)."""

    _armed_arrays: Optional[List["nn.NdArray"]] = None   # the armed reduction's arrays
    _pending = False     # a reduction is due at the next solver operation
    _watching = False    # nnabla's function hook marks every pass as due
    _reduced = False     # a reduction ran since the last arm

    @property
    def _hook_key(self) -> str:
        return f"nnabla_mpt.all_reduce_callback.{id(self)}"

    def all_reduce_callback(self, data: Union["nn.NdArray", Sequence["nn.NdArray"]],
                            pack_size: int, division: bool = False, group: str = "world",
                            scale_grad: float = 1, keep_dtype: bool = False) -> None:
        """nnabla's all-reduce "during the backward pass", for scripts that pass it to
        ``loss.backward(communicator_callbacks=...)``: returns ``None``, which the backward
        pass accepts, and arms the reduction of ``data`` for the next solver operation.

        nnabla's backward pass runs only callbacks made by its C++ communicators, so this
        CPU communicator cannot reduce inside it. The armed reduction runs right before
        the next solver operation (``update``, ``weight_decay``, ``clip_grad_by_norm``,
        ``scale_grad``, ``check_inf_or_nan_grad``; not ``zero_grad``), through nnabla's
        process-wide hooks: the solver sees the gradients bit for bit as
        :meth:`all_reduce` right after the backward pass gives them. A later call replaces
        the arrays. The reduction stays armed until :meth:`clear_all_reduce_callback`: one
        call before the loop serves every step, a pass making it due again through
        nnabla's function hook (a Python call per function of every pass, dropped once the
        script is seen to call this for each pass). Until that solver operation the
        gradients are this rank's own, and every array of ``data`` is reduced, also one
        the backward pass did not reach. See :doc:`distributed` for the differences from
        nnabla's callback.

        Args:
            data: One :class:`nnabla.NdArray` or a list of them (the ``.grad`` of the
                parameters), as for ``all_reduce``.
            pack_size: The number of values per pack in nnabla (>= 1); checked and
                otherwise unused: the arrays are reduced together, as one buffer.
            division: Divide the sum by the number of ranks.
            group: Only ``"world"`` is supported.
            scale_grad: Multiply the arrays by this factor before the reduction (finite).
            keep_dtype: Accepted for compatibility: each array keeps its dtype either way.

        Raises:
            TypeError: ``data`` is not an NdArray or a list of NdArrays, or an argument has
                the wrong type.
            ValueError: ``data`` is empty, ``pack_size`` is below 1, ``scale_grad`` is not
                finite or ``group`` is not ``"world"``.
        """
        arrays = ndarray_list(data)
        check.integer("pack_size", pack_size, ge=1)
        division = check.boolean("division", division)
        check_group(group)
        scale = check.real("scale_grad", scale_grad)
        check.boolean("keep_dtype", keep_dtype)
        self._arm(arrays, division, scale)

    def get_all_reduce_callback(self, packing_size: int = 2 << 20) -> None:
        """:meth:`all_reduce_callback` of the gradients of every parameter
        (``nn.get_parameters()``) with more than one rank, as the communicator wrapper of
        nnabla-examples offers it; with one rank nothing is armed. Returns ``None``, to
        pass to ``loss.backward(communicator_callbacks=...)``."""
        check.integer("packing_size", packing_size, ge=1)
        if self.size > 1:
            self.all_reduce_callback([v.grad for v in nn.get_parameters().values()],
                                     packing_size)

    @property
    def all_reduce_callback_armed(self) -> bool:
        """Whether :meth:`all_reduce_callback` armed a reduction (until
        :meth:`clear_all_reduce_callback`)."""
        return self._armed_arrays is not None

    def clear_all_reduce_callback(self) -> None:
        """Disarms the reduction armed by :meth:`all_reduce_callback` and removes its
        hooks from nnabla; nothing happens if none is armed."""
        if self._watching:
            callback.unset_function_post_hook(self._hook_key)
        if self._armed_arrays is not None:
            callback.unset_solver_pre_hook(self._hook_key)
        self._armed_arrays = None
        self._pending = self._watching = self._reduced = False

    def _arm(self, arrays: List["nn.NdArray"], division: bool, scale: float) -> None:
        """Arms the reduction of ``arrays`` (multiplied by ``scale`` first, divided by the
        number of ranks after if ``division``), replacing an armed one; it is due at the
        next solver operation.

        The first call also sets nnabla's function hook, which makes every later pass due
        (a callback made once and passed to every backward pass). A call after a reduction
        shows a script that arms for each pass: arming marks the pass, and the function
        hook, a Python call for every function of every pass, is removed.
        """
        if self._armed_arrays is None:
            callback.set_solver_pre_hook(self._hook_key, self._before_solver)
            callback.set_function_post_hook(self._hook_key, self._saw_pass)
            self._watching = True
        elif self._watching and self._reduced:
            callback.unset_function_post_hook(self._hook_key)
            self._watching = False
        self._armed_arrays, self._armed_division, self._armed_scale = arrays, division, scale
        self._pending, self._reduced = True, False

    def _saw_pass(self, function: Any) -> None:
        """nnabla's hook after each function of any forward or backward pass."""
        self._pending = True

    def _before_solver(self) -> None:
        """nnabla's hook before a solver processes each parameter: the first call while a
        reduction is due runs it, the others find nothing due."""
        if not self._pending:
            return
        try:
            if self._armed_scale != 1.0:
                for array in self._armed_arrays:
                    array *= self._armed_scale
            self.all_reduce(self._armed_arrays, division=self._armed_division, inplace=True)
        except BaseException:
            # nnabla goes on with the solver's operation after a hook raised: the
            # parameters would move by this rank's own gradients. End the job instead.
            logger.error(f"rank {self.rank} of {self.size}: the all-reduce "
                         f"armed by all_reduce_callback() failed inside nnabla's solver "
                         f"hook, where an error cannot stop the solver; aborting the MPI "
                         f"job (error code 1)\n{traceback.format_exc()}")
            hard_abort(self._comm.Abort, 1)
        finally:
            self._pending = False    # after the reduce: never a second one for this pass
            self._reduced = True
