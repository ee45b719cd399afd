"""Report and terminal views of the model's borders and its tying."""

from __future__ import annotations

from rich.table import Table

from vocablens.models import Borders, Provenance
from vocablens.render.html import Section, esc, table_html
from vocablens.geometry.tying import TieCheck


def _rows(borders: Borders, tie: TieCheck) -> list[tuple[str, str]]:
    d = borders.describe()
    return [
        ("family", d["family"]),
        ("V (matrix rows)", f"{d['vocab_size']:,}"),
        ("tokenizer vocabulary", f"{d['tokenizer_vocab_size']:,}" if d["tokenizer_vocab_size"] else "unknown"),
        ("padding rows", f"{d['padding_rows']:,}"),
        ("d_model", str(d["d_model"])),
        ("blocks", str(d["n_layers"])),
        ("input scale", f"{d['embed_scale']:g}"),
        ("final norm", str(d["final_norm"])),
        ("LM head bias", "yes" if d["lm_head_bias"] else "no"),
        ("final-logit softcap", "none" if d["softcap"] is None else f"{d['softcap']:g}"),
        ("tied (by storage)", "yes" if tie.tied else "no"),
        ("config tie_word_embeddings", str(tie.config_says_tied)),
        ("storage and config agree", "yes" if tie.consistent else "NO"),
        ("max |W_U - W_E|", f"{tie.max_abs_diff:.3g}"),
        ("mean row cosine(W_U, W_E)", f"{tie.mean_row_cosine:.4f}"),
        ("parameters saved by tying", f"{tie.saved_params:,}"),
    ]


def borders_table(borders: Borders, tie: TieCheck) -> Table:
    """Rich table: the borders and the tie check."""
    t = Table(title="Borders", title_justify="left", show_header=False)
    t.add_column("what")
    t.add_column("value")
    for k, v in _rows(borders, tie):
        t.add_row(k, v)
    return t


def borders_section(borders: Borders, tie: TieCheck, provenance: Provenance) -> Section:
    """Report section: where the weights came from, the borders, and the tie check."""
    tt = provenance.tensor_types
    quant = ", ".join(f"{k}: {v}" for k, v in tt.items()) if tt else provenance.quantization
    html = (
        f"<p>Weights: <b>{esc(provenance.name)}</b> — {esc(provenance.quantization)}"
        f"{', dequantized to ' + esc(provenance.dtype) if provenance.dequantized else ''}"
        f" (tensor storage read from the file: {esc(quant)}); source <code>{esc(provenance.shown_source)}</code>.</p>"
        + table_html(["what", "value"], [list(r) for r in _rows(borders, tie)])
        + ("<p class=\"note\">Tied: the LM head reads the same memory as the embedding, so every row is "
           "both a token's input vector and its output vector.</p>" if tie.tied else
           "<p class=\"note\">Untied: the LM head is a separate matrix.</p>")
    )
    return Section("borders", "Borders and tied check", html)
