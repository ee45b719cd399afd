"""`vocablens serve --lens DIR` serves every lens kind DIR holds (a Jacobian lens alone too), and every
message about a lens folder names the option of the interface the user is in: ``--lens`` for the CLI and
the explorer, `` `path` `` for the Python API (issue 48, item 8)."""

from __future__ import annotations

import json

import pytest
import torch

from serve_tiny import client
from tiny_dirs import run_cli, save_tiny, tiny_tokenizer


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """A tiny model (d=64, 2 blocks), a folder holding only a Jacobian lens of it (J = 2 I at every layer)
    and an empty folder."""
    from vocablens.lens.jacobian import JacobianLens

    r = tmp_path_factory.mktemp("lensdirs")
    save_tiny(r / "tiny", tiny_tokenizer())
    JacobianLens(2 * torch.eye(64).repeat(2, 1, 1), [0, 1], 2).save(r / "jacobian-only", dtype=torch.float32)
    (r / "empty").mkdir()
    return r


@pytest.fixture(scope="module")
def lm(root):
    import vocablens

    return vocablens.load(str(root / "tiny"))


def test_a_folder_holding_only_a_jacobian_lens_is_served(root, lm):
    """The Jacobian lens is read from the folder (its J, not an identity shipped elsewhere); the tuned lens,
    absent there and shipped for no tiny model, is a 400 that names --lens, never the library's `path`."""
    from vocablens.serve import ServerState, create_app

    state = ServerState(lm, model_spec=str(root / "tiny"), lens_path=str(root / "jacobian-only"), argmax=False)
    assert state.jacobian_note == "loaded" and state.tuned is None
    assert torch.equal(lm.translators["jacobian"].J, 2 * torch.eye(64).repeat(2, 1, 1))
    c = client(create_app(state))
    r = c.post("/api/lens", json={"prompt": "the class", "kind": "jacobian", "k": 3})
    assert r.status_code == 200, r.text[:300]
    assert r.json()["kind"] == "jacobian" and [x["kind"] for x in r.json()["lenses"]] == ["jacobian"]
    r = c.post("/api/lens", json={"prompt": "the class", "kind": "tuned", "k": 3})
    err = r.json()["error"]
    assert r.status_code == 400 and "no tuned lens" in err and "--lens" in err and "`path`" not in err, err
    health = c.get("/api/health").json()
    assert health["jacobian"] == "loaded" and "--lens" in health["tuned"] and "`path`" not in health["tuned"]


def test_a_folder_holding_no_lens_is_refused_naming_the_option(root, lm, capsys):
    """In the library: one BadInput naming both layouts and `path`; from `vocablens serve`: exit 2, one
    line naming --lens (and no server started)."""
    from vocablens.errors import BadInput
    from vocablens.serve import ServerState

    with pytest.raises(BadInput, match=r"no lens in .*empty: a tuned lens is lens\.safetensors .*jacobian\.safetensors") as e:
        ServerState(lm, model_spec=str(root / "tiny"), lens_path=str(root / "empty"), argmax=False)
    assert "`path`" in str(e.value) and "\n" not in str(e.value)
    code, out, err = run_cli(capsys, "serve", "--model", str(root / "tiny"), "--lens", str(root / "empty"),
                             "--port", "0", "--no-argmax")
    assert code == 2 and "vocablens serve:" not in out
    line = err.strip().splitlines()[-1]
    assert "no lens in" in line and "--lens takes a folder" in line and "`path`" not in err, err
    code, out, err = run_cli(capsys, "serve", "--model", str(root / "tiny"), "--lens", str(root / "nowhere"),
                             "--port", "0", "--no-argmax")
    assert code == 2 and "--lens " + str(root / "nowhere") + ": no such file or folder" in err, err


def test_the_python_api_names_path(root, lm):
    """`Model.load_jacobian_lens` / `load_lens` on a folder without that lens name `path` (the argument the
    caller gave), not a CLI option."""
    from vocablens.errors import BadInput

    with pytest.raises(BadInput) as e:
        lm.load_lens(root / "jacobian-only")
    assert "`path` takes a lens directory" in str(e.value) and "--lens" not in str(e.value)
    with pytest.raises(BadInput) as e:
        lm.load_jacobian_lens(root / "nowhere")
    assert "`path`" in str(e.value) and "--lens" not in str(e.value)
    with pytest.raises(BadInput) as e:
        lm.translator("jacobian", root / "empty")
    assert "--lens" not in str(e.value)


def test_the_json_of_health_is_one_object(root, lm):
    """The explorer's health names both lens notes (what the page shows when a kind is missing)."""
    from vocablens.serve import ServerState, create_app

    state = ServerState(lm, model_spec=str(root / "tiny"), argmax=False)  # no --lens: the shipped ones (none)
    d = json.loads(client(create_app(state)).get("/api/health").text)
    assert "no tuned lens shipped" in d["tuned"] and "--lens" in d["tuned"]
