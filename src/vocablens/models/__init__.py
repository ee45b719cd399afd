"""Layer 1: everything that knows about model families, files and the default model.

Modules, lowest first (each imports only modules before it; ``tests/unit/test_import_graph.py`` checks
there is no cycle): ``find`` (where a model keeps its decoder and blocks, config values under their
several names), ``dtypes`` (the one dtype table), ``catalogue`` (built-in configs), ``meta`` (a
meta-device model from a config), ``pages``, ``hooks`` (``ModelPatch``: whatever vocablens installs
on a model, put back exactly), ``tokens``, ``token_table``, ``checkpoint_files`` (a safetensors
checkpoint's tensors by name), ``source`` (a spec resolved once: :class:`Source`, its run dtype and
remote-code check), ``spec`` (what is wrong with a model's files, as one line), ``gguf_header`` (a GGUF file's header
and where its metadata disagrees with its tensors), ``tokenizer_files`` (why a tokenizer cannot be
built, as one line), ``tie`` ("tied" by storage, as
transformers decides it), ``config`` (a config without weights), ``provenance``, ``gguf_cache``,
``auto_class`` (which transformers Auto class builds a checkpoint: causal LM, else a vision-language
model's; the checkpoint's keys as the model names them), ``vision`` (images into a vision-language
model: the image checked, its processor, image positions), ``blocks`` (one view of a decoder block), ``unembed`` (the one unembedding), ``embed`` (the one
embedding: input scale, input norm, ``project_in``, lookup), ``weight_checks`` (NaN/inf weights,
never-trained rows), ``borders`` (the family adapter), ``final_norm`` (the final norm of a load
without modeling code, computed by the family's own module), ``blocks_forward`` (the blocks' forward,
stopped before the final norm), ``flops`` (attention shape and FLOP counts), ``loaded_model``
(:class:`LoadedModel`), ``sources`` (the directory the partial loads read), ``matrices_only`` (the two matrices and the
final norm read without modeling code), ``partial`` (what a load reads, ``Parts``, and the one
materializer, ``materialize_parts``), ``streaming`` (blocks read at each forward), ``loader`` (the one
entry: :func:`load` takes what to read; ``load_mode`` names the CLI's five reads).
"""

from vocablens.models.borders import Borders
from vocablens.models.embed import Embedding
from vocablens.models.weight_checks import untrained_rows
from vocablens.models.files.config import load_config
from vocablens.models.files.loader import LoadedModel, load
from vocablens.models.files.provenance import Provenance, gguf_provenance
from vocablens.models.files.source import Source, resolve_source
from vocablens.models.files.spec import DEFAULT_MODEL, default_gguf_path, resolve_spec

__all__ = [
    "Borders", "Embedding", "untrained_rows", "DEFAULT_MODEL", "LoadedModel", "Provenance", "default_gguf_path",
    "gguf_provenance", "load", "load_config", "resolve_source", "resolve_spec", "Source",
]
