"""What workers do per step (hogwild.workloads.base): supervised training on in-memory tensors
(hogwild.workloads.supervised), A3C on gymnasium environments (hogwild.workloads.a3c)."""
