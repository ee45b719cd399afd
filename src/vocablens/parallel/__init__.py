"""Layer 3: running analyses over several processes (``torch.distributed``, launched by torchrun)."""

from vocablens.parallel.processes import VocabParallelModel, common_seed, init_from_env  # noqa: F401
