"""The lens topics of :class:`vocablens.Model`, one module each: the translators a kind reads through
(:mod:`~vocablens.handle.lenses.loading`), reading the stream through them and the backward lens
(:mod:`~vocablens.handle.lenses.reading`), fitting a tuned or Jacobian lens
(:mod:`~vocablens.handle.lenses.training`), scoring lenses on a corpus
(:mod:`~vocablens.handle.lenses.evaluation`), a lens's stored quality (:mod:`~vocablens.handle.lenses.quality`),
a stream vector decomposed into Jacobian-lens tokens (:mod:`~vocablens.handle.lenses.decompose`), and
where lenses are before a model loads (:mod:`~vocablens.handle.lenses.sources`).
"""
