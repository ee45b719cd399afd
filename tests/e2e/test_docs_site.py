"""The documentation site (mkdocs.yml) builds with ``--strict``: no warning from mkdocs, the material
theme or mkdocstrings (a docstring griffe cannot parse, a link to a missing page or anchor, a page left
out of the build), offline, and its generated CLI reference names every command the CLI has."""

import logging
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site built once, in-process, into a temporary directory; -> (site dir, warnings logged)."""
    from mkdocs.commands.build import build
    from mkdocs.config import load_config

    out = tmp_path_factory.mktemp("site")
    records = _Records()
    logging.getLogger("mkdocs").addHandler(records)
    try:
        build(load_config(str(ROOT / "mkdocs.yml"), site_dir=str(out), strict=True))
    finally:
        logging.getLogger("mkdocs").removeHandler(records)
    return out, [f"{r.name}: {r.getMessage()}" for r in records.records]


def test_site_builds_strict_without_warnings(site):
    out, warnings = site
    assert warnings == []
    for page in ("index.html", "getting-started/index.html", "tour/index.html", "cli/index.html",
                 "performance/index.html", "design/index.html", "api/ops/index.html"):
        assert (out / page).is_file(), page


def test_cli_reference_lists_every_command_and_option(site):
    """The CLI page is generated from the typer app: every command and sub-command has its section,
    and an option added to a command shows up without editing any page."""
    import typer.main

    import vocablens.cli

    html = (site[0] / "cli" / "index.html").read_text(encoding="utf-8")
    root = typer.main.get_command(vocablens.cli.app)
    names = []
    for name, cmd in root.commands.items():
        names.append(f"vocablens {name}")
        names += [f"vocablens {name} {sub}" for sub in getattr(cmd, "commands", {}) if sub != "show"]
    assert len(names) >= 17
    headings = set(re.findall(r"<h[23] id=\"[^\"]*\"><code>(vocablens [a-z -]+)</code>", html))
    assert set(names) <= headings, sorted(set(names) - headings)
    for option in ("--max-memory", "--budget", "--verify-all", "--early-exit", "--special-text"):
        assert re.search(rf"<li><code>[^<]*{option}\b", html), option


def test_api_reference_renders_the_docstrings(site):
    """mkdocstrings rendered the functions with their documented arguments (not an empty page)."""
    html = (site[0] / "api" / "ops" / "index.html").read_text(encoding="utf-8")
    assert 'id="vocablens.ops.logprobs.token_logprobs"' in html
    assert "ShapeMismatch" in html and "BadInput" in html


def test_api_reference_lists_every_public_method_of_model(site):
    """The API page of ``vocablens.Model`` has a section, with its signature, for every public method
    ``dir(Model)`` names, grouped by topic: each under the mixin that writes it (``vocablens.Model`` is
    one mixin per topic, issue 52), the mixins in the order ``Model`` composes them; and the attributes
    table of ``Model`` has one row per attribute (it had one row named ``model,`` typed
    ``(tokenizer, borders, provenance)``)."""
    import inspect

    from vocablens.handle import Model

    html = (site[0] / "api" / "model" / "index.html").read_text(encoding="utf-8")
    public = {n for n in dir(Model) if not n.startswith("_")}
    methods = {n for n in public if callable(getattr(Model, n)) or isinstance(getattr(Model, n), property)}
    assert {"lens", "settle", "expand", "trim", "steer", "save", "report", "add_lens", "load_lens"} <= methods

    def path(name: str) -> str:      # the class the docs render it under: the one that writes it
        member = inspect.getattr_static(Model, name)
        fn = inspect.unwrap(member.fget if isinstance(member, property) else getattr(member, "__func__", member))
        cls = fn.__qualname__.split(".")[0]
        return "vocablens.handle.Model" if cls == "Model" else f"{fn.__module__}.{cls}"

    starts = {}
    for name in methods:
        anchor = f'id="{path(name)}.{name}"'
        assert anchor in html, (name, anchor)
        starts[name] = html.index(anchor)
        if isinstance(getattr(Model, name), property):
            continue
        section = html[starts[name]:]
        signature = re.sub(r"<[^>]+>", "", section[section.index('class="doc-signature'):section.index("</pre>")])
        params = [p for p in inspect.signature(getattr(Model, name)).parameters if p not in ("self", "cls")]
        assert f"{name}(" in signature and all(p in signature for p in params), (name, signature[:300])
    topics = [f'id="{c.__module__}.{c.__name__}"' for c in Model.__bases__]
    at = [html.index(t) for t in topics]
    assert at == sorted(at), "the topics in the order Model composes them"
    for name, where in starts.items():   # each method inside its own topic's section
        if path(name) != "vocablens.handle.Model":
            i = topics.index(f'id="{path(name)}"')
            assert at[i] < where < (at[i + 1] if i + 1 < len(at) else len(html)), name
    table = html[html.index("doc-section-title\">Attributes:"):]
    table = table[:table.index("</table>")]
    rows = re.findall(r'<tr class="doc-section-item">\s*<td><code><span title="vocablens\.handle\.Model\.([^"]+)"', table)
    attributes = {"model", "tokenizer", "borders", "provenance", "spec", "translators", "surgery", "processor"}
    assert set(rows) == attributes and len(rows) == len(attributes), rows
    assert attributes | methods >= public, sorted(public - attributes - methods)


def test_the_lens_and_explorer_guides_name_the_jacobian_lens():
    """The guide pages of `vocablens lens` and `vocablens serve` left the Jacobian lens out (issue 48):
    each names it, the kind that selects it and the command that fits one."""
    for page in ("lens.md", "serve.md"):
        text = (ROOT / "docs" / "guide" / page).read_text(encoding="utf-8")
        assert "Jacobian lens" in text and re.search(r"kind\W+[a-z|,\" ]*jacobian", text) and "fit-jacobian" in text, page


def test_tour_examples_are_shown_as_console_blocks(site):
    """docs/tour.md keeps its bare doctest examples (the suite runs them); the site fences them."""
    text = (ROOT / "docs" / "tour.md").read_text(encoding="utf-8")
    assert "```pycon" not in text and "\n>>> import vocablens\n" in text
    html = (site[0] / "tour" / "index.html").read_text(encoding="utf-8")
    assert "<blockquote>" not in html
    assert html.count('<span class="gp">&gt;&gt;&gt; </span>') >= 20      # the pycon lexer's prompts


def test_fence_doctests_leaves_fenced_code_alone():
    """The hook wraps a bare example run (up to the blank line) and nothing inside an existing fence."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("doctest_blocks", ROOT / "docs" / "hooks" / "doctest_blocks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    md = "text\n\n>>> 1 + 1\n2\n\n```\n>>> not an example\n```\n>>> x = 1\n"
    assert mod.fence_doctests(md) == ("text\n\n```pycon\n>>> 1 + 1\n2\n```\n\n```\n>>> not an example\n```\n"
                                      "```pycon\n>>> x = 1\n```\n")


def test_api_pages_show_sphinx_roles_as_code(site):
    """``:func:`~a.b.c``` in a docstring shows as ``c`` in code, not as the role's name."""
    html = "".join(p.read_text(encoding="utf-8") for p in (site[0] / "api").rglob("index.html"))
    assert not re.search(r":(func|class|mod|meth|attr|data):<code>", html)
    assert "<code>Borders</code>" in html
