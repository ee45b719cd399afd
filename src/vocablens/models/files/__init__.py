"""Reading a model's files and formats: what the user named resolved once (``source``: :class:`Source`),
the one loader (``loader``: :func:`load`, ``load_mode``) and what it reads through: the whole model
(``whole``: a directory or hub id through ``pretrained``, a GGUF file through its float32 cache), the parts
of it (``partial``, ``matrices_only``, ``final_norm``), the blocks streamed at each forward (``streaming``),
a device map (``placement``, ``offload``), GGUF files and their float32 cache (``gguf_header``,
``gguf_cache``), safetensors checkpoints (``checkpoint_files``, ``tie``, ``auto_class``), tokenizer files,
quantized checkpoints (``quantized``), configs without weights (``config``, ``meta``, ``catalogue``), the
readout check run by a whole load and kept between runs (``readout_store``), provenance, and what is wrong
with a file (``spec``, ``remote_code``). It builds the model abstraction of :mod:`vocablens.models`
(``Borders``, ``Embedding``, ``Unembedding`` ...) from what it read; the abstraction imports from here only
how stored weights are held (``quantized``: read dequantized; ``offload``: kept on disk by accelerate; ``pages``:
mapped pages released) and, for a vision-language model's processor, ``source``.

Public names are importable from :mod:`vocablens.models` as before.
"""
