"""The public surface of ``vocablens.Model`` (issue 52, part A): which names it offers, and in which topic
module each is written, so that a change of either is deliberate (this table changes with it).

Oracle: the class itself, read by ``dir`` and ``inspect`` (the tensor-parallel guard wraps the methods with
``functools.wraps``, so the original function's module is read through ``inspect.unwrap``), and the
source of each topic module, read as a syntax tree (the ``self`` annotation names that topic's protocol).
"""

import ast
import dataclasses
import inspect
import typing
from pathlib import Path

from vocablens.handle import Model, protocols
from vocablens.models.files.loaded_model import LoadedModel

SRC = Path(__file__).resolve().parents[2] / "src"

#: topic module -> (its mixin, the protocol its methods take as ``self``, the public names written there)
TOPICS = {
    "vocablens.handle.model": ("Model", None, {"of", "spec", "processor"}),
    "vocablens.handle.tokens": ("TokenInput", "NeedsTokens", {"token_id", "position"}),
    "vocablens.handle.geometry": ("Geometry", "NeedsMatrices", {"anatomy", "tie_check", "neighbors", "pca"}),
    "vocablens.handle.scoring": ("Scoring", "NeedsScoring", {"score", "generate", "stop_ids"}),
    "vocablens.handle.lenses.loading": ("LensLoading", "NeedsLensLoading",
                                        {"tuned_lens", "load_lens", "add_lens", "translator", "load_jacobian_lens"}),
    "vocablens.handle.lenses.reading": ("LensReading", "NeedsLensReading", {"lens", "forward", "backward_lens"}),
    "vocablens.handle.lenses.training": ("LensTraining", "NeedsLensFitting", {"train_lens", "fit_jacobian_lens"}),
    "vocablens.handle.lenses.evaluation": ("LensEvaluation", "NeedsLensScoring", {"eval_lens", "compare_lenses"}),
    "vocablens.handle.lenses.quality": ("LensQuality", "NeedsLensQuality",
                                        {"measure_lens_quality", "quality_after_fit", "ensure_lens_quality"}),
    "vocablens.handle.lenses.decompose": ("LensDecomposition", "NeedsDecomposition", {"decompose"}),
    "vocablens.handle.trajectories": ("Trajectories", "NeedsTrajectories", {"trajectory", "anomaly", "settle"}),
    "vocablens.handle.vocab_space": ("VocabSpace", "NeedsVocabSpace", {"explain", "project", "steer", "align"}),
    "vocablens.handle.argmax": ("ArgmaxAndBottleneck", "NeedsArgmax", {"argmax", "reserved_tokens", "bottleneck"}),
    "vocablens.handle.undertrained": ("UndertrainedTokens", "NeedsMatrices", {"undertrained", "undertrained_within"}),
    "vocablens.handle.surgery": ("VocabularySurgery", "NeedsSurgery", {"expand", "trim", "save", "surgery"}),
    "vocablens.handle.report": ("ReportWorkflow", "NeedsLoaded", {"report"}),
    "vocablens.handle.corpus": ("CorpusRows", "NeedsPacking", {"corpus_rows", "eval_rows", "first_rows"}),
    "vocablens.handle.images": ("Images", "NeedsImages", {"image_prompt", "position_labels", "image_patch",
                                                          "with_images"}),
    # the loaded model: text -> ids, the one place (layer 1)
    "vocablens.models.files.loaded_model": ("LoadedModel", None, {"encode", "encode_batch", "encode_raw", "prompt_ids",
                                                            "pack", "pieces", "tokens", "n_bytes",
                                                            "without_tokenizer"}),
}


def _public() -> set[str]:
    return {n for n in dir(Model) if not n.startswith("_")}


def _home(name: str) -> str:
    """The module whose source defines ``Model.name`` (a method, a property or a class attribute)."""
    owner = next(c for c in Model.__mro__ if name in c.__dict__)
    member = owner.__dict__[name]
    fn = member.fget if isinstance(member, property) else member.__func__ if isinstance(member, classmethod) else member
    if inspect.isfunction(fn):
        return inspect.unwrap(fn).__module__
    return owner.__module__


def test_the_public_surface_of_model_is_the_expected_set():
    expected = set().union(*(names for _, _, names in TOPICS.values()))
    assert _public() == expected, (sorted(_public() - expected), sorted(expected - _public()))
    assert len(expected) == sum(len(names) for _, _, names in TOPICS.values())   # each name in one topic
    assert not {"single_token", "token_ids"} & _public()                          # one way to a token's id


def test_each_public_name_is_written_in_its_topic_module():
    for module, (_, _, names) in TOPICS.items():
        for name in names:
            assert _home(name) == module, (name, _home(name), module)


def test_model_is_the_mixins_of_the_table_and_each_mixin_is_typed_by_its_protocol():
    mixins = [(module, cls) for module, (cls, _, _) in TOPICS.items() if cls not in ("Model", "LoadedModel")]
    assert [(c.__module__, c.__name__) for c in Model.__bases__] == [*mixins, (LoadedModel.__module__, "LoadedModel")]
    for module, (cls, proto, names) in TOPICS.items():
        if proto is None:
            continue
        assert typing.get_origin(getattr(protocols, proto)) is None and getattr(protocols, proto)._is_protocol
        tree = ast.parse((SRC / Path(*module.split("."))).with_suffix(".py").read_text(encoding="utf-8"))
        node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
        methods = [f for f in node.body if isinstance(f, ast.FunctionDef)]
        assert {f.name for f in methods} >= names - {"surgery"}
        for f in methods:          # every method's self is that topic's protocol, nothing else
            assert ast.unparse(f.args.args[0].annotation) == proto, (cls, f.name)


def test_the_flat_verbs_keep_their_signatures():
    """The verbs users call (``m.lens``, ``m.score`` ...) take the parameters they took before the split."""
    params = {
        "lens": ["texts", "kind", "k", "positions", "layers", "chat", "prefix", "lens_dir", "progress", "stream",
                 "lenses", "images"],
        "score": ["text", "top_k", "special_text", "vocab_parallel"],
        "neighbors": ["tokens", "k", "mean"],
        "argmax": ["bias", "include_padding", "norm", "verify_all", "budget_s", "stored", "progress", "reserved"],
        "project": ["token", "block", "neurons", "k", "keys", "sample", "seed", "norm_gain", "interpretable", "head",
                    "circuit", "max_sources"],
        "token_id": ["token", "what"],
        "undertrained_within": ["budget_s", "batch_size", "progress"],
        "steer": ["promote", "suppress", "top_n", "scale", "blocks", "suppress_mode", "prompt", "corpus", "heldout",
                  "new_tokens", "progress", "notes", "started"],
    }
    for name, want in params.items():
        got = [p for p in inspect.signature(getattr(Model, name)).parameters if p != "self"]
        assert got == want, (name, got)


def _declared(proto: type) -> set[str]:
    """The names a protocol declares (its own and its bases'), read from the class: annotations and methods."""
    names: set[str] = set()
    for c in proto.__mro__:
        if c.__module__ == protocols.__name__:
            names |= set(getattr(c, "__annotations__", {})) | {n for n, v in vars(c).items() if callable(v)
                                                                or isinstance(v, property)}
    return names


def test_each_topic_reads_of_self_only_what_its_protocol_declares():
    """What a topic needs of the model is what its protocol says: every ``self.X`` a mixin's methods read
    (its own methods included) is declared by that protocol, so the protocol is the whole list."""
    for module, (cls, proto, _) in TOPICS.items():
        if proto is None:
            continue
        tree = ast.parse((SRC / Path(*module.split("."))).with_suffix(".py").read_text(encoding="utf-8"))
        node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
        used = {n.attr for n in ast.walk(node)
                if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self"}
        assert used <= _declared(getattr(protocols, proto)), (cls, sorted(used - _declared(getattr(protocols, proto))))
        has = set(dir(Model)) | {f.name for f in dataclasses.fields(Model)}
        assert _declared(getattr(protocols, proto)) <= has, proto                     # Model satisfies it


def test_each_protocol_method_has_the_parameters_of_the_models_method():
    """A protocol's methods are the model's own, parameter for parameter (names, kinds and defaults), so a
    type checker reading a topic against its protocol checks the calls it makes."""
    for proto in {p for _, p, _ in TOPICS.values() if p}:
        for c in getattr(protocols, proto).__mro__:
            if c.__module__ != protocols.__name__:
                continue
            for name, member in vars(c).items():
                if not inspect.isfunction(member) or name.startswith("__"):
                    continue
                mine = inspect.signature(member).parameters
                theirs = inspect.signature(inspect.unwrap(getattr(Model, name))).parameters
                assert [(p.name, p.kind, p.default) for p in mine.values()][1:] == \
                    [(p.name, p.kind, p.default) for p in theirs.values()][1:], (proto, name)


def test_a_model_named_to_the_class_says_load_makes_it():
    """``vocablens.Model("smollm2")`` failed with ``missing 3 required positional arguments:
    'tokenizer', 'borders', and 'provenance'`` (a new user's first try, found from a clean clone): now
    one line names the call that makes one. A loaded model still wraps (``Model.of``) and copies."""
    import copy
    from pathlib import Path

    import pytest

    import vocablens

    with pytest.raises(TypeError, match=r"m = vocablens\.load\('smollm2'\)"):
        vocablens.Model("smollm2")
    with pytest.raises(TypeError, match=r"vocablens\.load\('some/dir'\)"):
        vocablens.Model(model=Path("some/dir"))
    from tiny_models import make_tiny
    from vocablens.models import Borders, Provenance

    model = make_tiny("llama")
    m = vocablens.Model(model, None, Borders.from_model(model),
                        Provenance(spec="tiny", name="tiny", source="tiny", format="test", quantization=""))
    assert copy.copy(m).borders is m.borders and vocablens.Model.of(m) is m
