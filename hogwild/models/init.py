"""Initialisation at memory speed for big tables.

torch's `normal_` fills a CPU tensor on one core at about 180M numbers/s here: a 3 GiB
embedding table takes 4-5 s of the run's start. `normal_` below fills a big tensor in chunks on
every core (torch releases the GIL in its kernels), each chunk from its own generator seeded
from torch's default one, so a run seeded with `torch.manual_seed` gets the same table every
time. Tensors under `PARALLEL_MIN_NUMEL` are filled by torch's own `nn.init.normal_`, exactly
as before.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch

from hogwild.config.schema import usable_cores

PARALLEL_MIN_NUMEL = 1 << 24  # 64 MiB of float32
CHUNK_NUMEL = 1 << 22


def normal_(
    tensor: torch.Tensor,
    mean: float = 0.0,
    std: float = 1.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """N(mean, std) into `tensor`; the chunks' seeds come from `generator` (torch's default one
    when None)."""
    if (
        tensor.numel() < PARALLEL_MIN_NUMEL
        or tensor.device.type != "cpu"
        or not tensor.is_contiguous()
    ):
        return torch.nn.init.normal_(tensor, mean, std, generator=generator)
    base = int(torch.randint(0, 2**62, (1,), generator=generator))  # seeded runs repeat
    flat = tensor.detach().view(-1)
    starts = range(0, flat.numel(), CHUNK_NUMEL)

    def fill(i: int) -> None:
        g = torch.Generator().manual_seed(base + i)
        flat[starts[i] : starts[i] + CHUNK_NUMEL].normal_(mean, std, generator=g)

    with torch.no_grad(), ThreadPoolExecutor(usable_cores()) as pool:
        list(pool.map(fill, range(len(starts))))
    return tensor
