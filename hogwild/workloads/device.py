"""Where the model and the data live, and how batches reach the device.

The rules (docs/cuda.md):

- One shared model on one device. With CUDA the orchestrator moves the model there once and the
  workers receive its parameters through CUDA IPC, without a copy; every worker's update lands
  in the same GPU memory, which is what makes it Hogwild. Replicas on several GPUs would need a
  rule to keep them in step (model averaging), which is a different algorithm: pick the GPU with
  `trainer.device=cuda:N` and run one job per GPU.
- The training data goes to the GPU too when it fits (`trainer.data_on_device=auto`: at most half
  of the free memory), so a batch is an index_select on the device. Otherwise it stays in host
  shared memory and each worker stages batches through two pinned buffers with non-blocking
  copies (`HostBatches`).
- The producer (the orchestrator) keeps every shared CUDA tensor alive until all workers have
  exited: the Trainer holds the model and the shared data until the supervisor has joined them.
"""

from __future__ import annotations

import dataclasses

import torch

from hogwild.errors import ConfigError

FREE_FRACTION = (
    0.5  # `auto` puts the data on the GPU when it needs at most this share of the free memory
)


def resolve(name: str) -> torch.device:
    """`cuda` means the current CUDA device; give it its index so every process uses the same one."""
    device = torch.device(name)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


@dataclasses.dataclass(frozen=True)
class Layout:
    """The memory format 4-D inputs go to the model in: channels_last matches conv weights laid
    out the same way (oneDNN's fast path on the CPU); anything else passes through."""

    channels_last: bool = False

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return (
            x.contiguous(memory_format=torch.channels_last)
            if self.channels_last and x.dim() == 4
            else x
        )


def data_goes_to_device(
    nbytes: int, device: torch.device, policy: str, free_bytes: int | None = None
) -> bool:
    """Decide where the training split lives. `free_bytes` is the device's free memory (asked of
    CUDA when None); a pure function of its inputs otherwise, so the rule is testable on a CPU."""
    if device.type == "cpu" or policy == "false":
        return False
    if free_bytes is None:
        free_bytes = torch.cuda.mem_get_info(device)[0]
    if policy == "true":
        if nbytes > free_bytes:
            raise ConfigError(
                f"trainer.data_on_device=true: the training split needs {nbytes / 2**20:,.0f} MiB but {device} "
                f"has {free_bytes / 2**20:,.0f} MiB free; use data_on_device=auto or false"
            )
        return True
    return nbytes <= FREE_FRACTION * free_bytes


class HostBatches:
    """Batches from host tensors to a CUDA device: index_select into one of two pinned buffers,
    then a non-blocking copy. A buffer is reused only after the copy that read it has finished
    (a CUDA event per buffer), so the next batch is gathered while the GPU still computes."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, batch_size: int, device: torch.device):
        self.x, self.y, self.device, self.turn = x, y, device, 0
        self.slots = [
            (
                torch.empty((batch_size, *x.shape[1:]), dtype=x.dtype, pin_memory=True),
                torch.empty((batch_size, *y.shape[1:]), dtype=y.dtype, pin_memory=True),
                torch.cuda.Event(),
            )
            for _ in range(2)
        ]

    def __call__(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        bx, by, copied = self.slots[self.turn]
        self.turn ^= 1
        copied.synchronize()  # the copy that last read this buffer is done (at once if never recorded)
        n = idx.numel()
        torch.index_select(self.x, 0, idx, out=bx[:n])
        torch.index_select(self.y, 0, idx, out=by[:n])
        x, y = bx[:n].to(self.device, non_blocking=True), by[:n].to(self.device, non_blocking=True)
        copied.record()
        return x, y
