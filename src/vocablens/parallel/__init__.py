"""Layer 3: running analyses over several processes (``torch.distributed``, launched by torchrun)."""

from vocablens.parallel.processes import VocabParallelModel, allreduce_sum, common_seed, gather_columns, init_from_env, share  # noqa: F401
