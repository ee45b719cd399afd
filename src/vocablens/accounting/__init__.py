"""Layer 3: accounting of the two borders — parameters, bytes and FLOPs of the embedding and LM head."""

from vocablens.accounting.anatomy import Anatomy, DEFAULT_CONTEXT, LogitsMemory, WEIGHT_FORMATS, anatomy, anatomy_of, count_parameters, logits_memory, lookup_bytes  # noqa: F401
