"""The optimizer's side of both processes: the lr schedule, the shared optimizer state, and
RowwiseAdagrad (one accumulator per embedding row: `optimizer=rowwise_adagrad`)."""

from hogwild.optim.rowwise_adagrad import RowwiseAdagrad

__all__ = ["RowwiseAdagrad"]
