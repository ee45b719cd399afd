"""Library errors name function arguments (`` `max_memory` ``); the CLI prints its own option in their place."""

from __future__ import annotations

import vocablens.cli  # noqa: F401  (registers the commands)
from vocablens.cli.common import in_cli_words, in_command_words


def test_an_argument_the_command_takes_becomes_its_option():
    assert in_cli_words("`max_memory` takes a size such as 200MB; got 'x'", ["score", "-m", "m"]) == \
        "--max-memory takes a size such as 200MB; got 'x'"
    assert in_cli_words("`steps` must be at least 1; got 0", ["lens", "train", "--steps", "0"]) == \
        "--steps must be at least 1; got 0"


def test_the_default_subcommand_and_a_differently_named_parameter():
    # `lens PROMPT` runs `lens show`, whose --kind is the library's kind; project's --sample is its per_block
    assert in_cli_words("`kind` must be one of logit, tuned", ["lens", "hello"]) == "--kind must be one of logit, tuned"
    # the CLI names k by its short form (-k, beside --top-k), as its messages always have
    assert in_cli_words("`k` must be >= 1", ["lens", "hello"]) == "-k must be >= 1"
    assert in_cli_words("`per_block` must be an integer of at least 1; got 0", ["project", "--sample", "0"]) == \
        "--sample must be an integer of at least 1; got 0"


def test_other_names_and_messages_stay_as_they_are():
    assert in_cli_words("`max_memory` takes a size", ["neighbors"]) == "`max_memory` takes a size"
    assert in_cli_words("train one with `vocablens lens train`", ["lens", "eval"]) == \
        "train one with `vocablens lens train`"
    assert in_cli_words("no backticks --here", []) == "no backticks --here"


def test_an_option_every_command_takes_and_the_image_files():
    # --dtype and --device-map are the app's own options: any command takes them
    assert in_cli_words("unknown `dtype` 'x'", ["neighbors"]) == "unknown --dtype 'x'"
    assert in_cli_words("`tp` and `device_map` are two ways", ["lens", "hi", "--tp"]) == "--tp and --device-map are two ways"
    # the library's `images` are the commands' --image files
    assert in_cli_words("`images`: no such file 'x.png'", ["report"]) == "--image: no such file 'x.png'"


def test_a_note_told_to_a_running_command_names_its_options():
    import typer

    try:  # the click the app runs on: typer's own copy where it carries one (a context of another click is not seen)
        from typer._click import Context
    except ImportError:  # pragma: no cover
        from click import Context

    from vocablens.cli.common import app

    root = typer.main.get_command(app)
    lens = root.commands["lens"]
    with Context(root, info_name="vocablens") as top, Context(lens, parent=top, info_name="lens") as mid, \
            Context(lens.commands["eval"], parent=mid, info_name="eval"):
        assert in_command_words("evaluating on pydoc-topics; give `corpus` to choose") == \
            "evaluating on pydoc-topics; give --corpus to choose"
    assert in_command_words("give `corpus` to choose") == "give `corpus` to choose"  # no command running
