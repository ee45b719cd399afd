"""Layer 1: everything that knows about model families, files and the default model, in two packages.

``vocablens.models`` (here) is the model abstraction, lowest first (each module imports only modules
before it; ``tests/unit/test_import_graph.py`` checks there is no cycle): ``find`` (where a model keeps
its decoder and blocks, config values under their several names), ``hooks`` (``ModelPatch``: whatever
vocablens installs on a model, put back exactly), ``shown_bytes``, ``tokens``, ``token_table``,
``token_input``, ``tensor_parallel`` (a head split over the torchrun ranks), ``blocks`` (one view of a
decoder block), ``unembed`` (the one unembedding), ``embed`` (the one embedding: input scale, input
norm, ``project_in``, lookup), ``weight_checks`` (NaN/inf weights, never-trained rows), ``readout``
(what runs between the last block and the logits, found and checked), ``blocks_forward`` (the blocks'
forward, stopped before the final norm), ``borders`` (the family adapter), ``flops`` (attention shape and
FLOP counts), ``vision`` (images into a vision-language model: the image checked, its processor, image
positions).

``vocablens.models.files`` reads files and formats and builds the abstraction from them: ``source``
(what the user named, resolved once: :class:`Source`, its run dtype and remote-code check), ``spec``
(what is wrong with a model's files, as one line), ``loader`` (the one entry: :func:`load` takes what
to read; ``load_mode`` names the CLI's five reads), ``whole``, ``pretrained``, ``partial`` (``Parts`` and the one
materializer), ``matrices_only``, ``final_norm``, ``streaming``, ``placement``, ``offload``,
``quantized``, ``gguf_header``, ``gguf_cache``, ``checkpoint_files``, ``tie``, ``auto_class``,
``tokenizer_files``, ``config`` (a config without weights), ``meta``, ``catalogue``, ``dtypes``,
``pages``, ``provenance``, ``readout_store``, ``remote_code``, ``sources``, ``loaded_model``
(:class:`LoadedModel`). The abstraction imports from it only how stored weights are held
(``quantized``, ``offload``, ``pages``) and, for a processor, ``source``.

The public names below are importable from ``vocablens.models`` whichever package holds them.
"""

from vocablens.models.borders import Borders
from vocablens.models.embed import Embedding
from vocablens.models.weight_checks import untrained_rows
from vocablens.models.files.config import load_config
from vocablens.models.files.loader import LoadedModel, load
from vocablens.models.files.gguf_header import gguf_provenance
from vocablens.models.files.provenance import Provenance
from vocablens.models.files.source import Source, resolve_source
from vocablens.models.files.spec import DEFAULT_MODEL, default_gguf_path, resolve_spec

__all__ = [
    "Borders", "Embedding", "untrained_rows", "DEFAULT_MODEL", "LoadedModel", "Provenance", "default_gguf_path",
    "gguf_provenance", "load", "load_config", "resolve_source", "resolve_spec", "Source",
]
