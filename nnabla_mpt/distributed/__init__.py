"""Training over ranks: the MPI communicator, reductions, the ranks' agreement; may import core, step."""
