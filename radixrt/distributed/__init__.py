"""Tensor parallelism's collectives: one rank's group and a small communicator over
torch.distributed (NCCL on CUDA, gloo on the CPU). `TPGroup.single()` is the group of one
rank, whose collectives return their input: code written for tp=N runs unchanged at tp=1."""

from radixrt.distributed.group import TPGroup, init_tp_group
from radixrt.errors import RankDied

__all__ = ["RankDied", "TPGroup", "init_tp_group"]
