"""Attention heatmaps: `vaswani-mt attention MODEL "A sentence." --out DIR`.

For one sentence (and its translation: given with `target=`, or the model's greedy translation) this runs one
forward pass with ``output_attentions=True`` and draws the three kinds of attention of §3.2.3, one PNG per layer
with a grid of heads:

* ``encoder-self_layer{i}.png``: rows are source positions (queries), columns source positions (keys);
* ``decoder-self_layer{i}.png``: rows are the target tokens being predicted, columns the decoder inputs they may
  attend to (``<s>`` and the earlier target tokens; the future is masked, hence the empty upper triangle);
* ``encoder-decoder_layer{i}.png``: rows are the target tokens being predicted, columns source tokens.

Row i of the decoder maps belongs to the decoder position whose input is ``<s>`` / target token i-1 and which
predicts target token i. Layers and heads are numbered from 0.

Plotting needs matplotlib (``pip install "vaswani-mt[plot]"``); it uses the Agg backend through
``matplotlib.figure.Figure`` and never touches pyplot's global state. :func:`attention_maps` returns the matrices
without plotting. One drawing serves both pictures: :func:`plot_attention` (the command's grids of heads) and
:func:`heatmap_figure` (one head, or the average of the heads, as `vaswani-mt demo` shows it) draw each panel with
:func:`draw_heatmap`.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

import torch

from ..model.pipeline_vaswani import encode_source, preprocess_text

INSTALL_HINT = 'attention heatmaps need matplotlib: pip install "vaswani-mt[plot]"'
KINDS = (("encoder-self", "encoder"), ("decoder-self", "decoder"), ("encoder-decoder", "cross"))
# what the rows (queries) and the columns (keys) of each kind of map are
AXES = {"encoder": ("source tokens", "source tokens"), "decoder": ("predicted target tokens", "decoder inputs"),
        "cross": ("predicted target tokens", "source tokens")}


@torch.no_grad()
def attention_maps(model, tokenizer, sentence: str, target: str | None = None,
                   max_new_tokens: int | None = None, *, target_ids: Sequence[int] | None = None) -> dict:
    """Attention weights of every layer and head for `sentence` translated as `target` (default: the model's
    greedy translation, at most `max_new_tokens` tokens, default source length + 50). `target_ids` gives the
    translation as token ids instead (the generated tokens without the decoder start, ending with ``</s>`` when the
    translation ended), e.g. one hypothesis of a beam search, drawn exactly as it was generated.

    Returns a dict with
        ``source_tokens``: source token strings (with the final ``</s>``), length S;
        ``decoder_input_tokens``: ``<s>`` and the target tokens but the last, length T (decoder self-attention keys);
        ``target_tokens``: the target tokens, ending with ``</s>`` when the translation ended, length T (what each
        decoder position predicts);
        ``translation``: the target as text;
        ``encoder``: tensor [encoder layers, heads, S, S]; ``decoder``: [decoder layers, heads, T, T];
        ``cross``: [decoder layers, heads, T, S] (encoder-decoder attention). Rows are queries and sum to 1.
    The model runs in eval mode (restored afterwards)."""
    if not sentence.strip():
        raise ValueError("cannot draw attention for an empty sentence")
    if target is not None and target_ids is not None:
        raise ValueError("give the translation as target or as target_ids, not both")
    config = model.config
    source_ids = encode_source(tokenizer, sentence, config.max_position_embeddings, config=config)
    input_ids = torch.tensor([source_ids], device=model.device)
    attention_mask = torch.ones_like(input_ids)
    was_training = model.training
    model.eval()
    try:
        if target_ids is not None:
            target_ids = list(target_ids)
        elif target is None:
            generated = model.generate(input_ids=input_ids, attention_mask=attention_mask, num_beams=1,
                                       do_sample=False, max_new_tokens=max_new_tokens)[0].tolist()
            target_ids = generated[1:]
            eos = config.eos_token_id[0] if isinstance(config.eos_token_id, list) else config.eos_token_id
            if eos in target_ids:
                target_ids = target_ids[: target_ids.index(eos) + 1]
        else:
            target = preprocess_text(target, getattr(config, "preprocess", None), getattr(config, "target_lang", None))
            target_ids = encode_source(tokenizer, target, config.max_position_embeddings)  # text with its </s>
        if not target_ids:
            raise ValueError("the target is empty")
        decoder_input_ids = [config.decoder_start_token_id] + target_ids[:-1]
        outputs = model(input_ids=input_ids, attention_mask=attention_mask,
                        decoder_input_ids=torch.tensor([decoder_input_ids], device=model.device),
                        output_attentions=True, use_cache=False)
    finally:
        model.train(was_training)
    return {
        "source_tokens": tokenizer.convert_ids_to_tokens(source_ids),
        "decoder_input_tokens": tokenizer.convert_ids_to_tokens(decoder_input_ids),
        "target_tokens": tokenizer.convert_ids_to_tokens(target_ids),
        "translation": tokenizer.decode(target_ids, skip_special_tokens=True),
        "encoder": torch.stack([a[0] for a in outputs.encoder_attentions]).float().cpu(),
        "decoder": torch.stack([a[0] for a in outputs.decoder_attentions]).float().cpu(),
        "cross": torch.stack([a[0] for a in outputs.cross_attentions]).float().cpu(),
    }


def _select(requested: Sequence[int] | None, count: int, what: str) -> list[int]:
    if requested is None:
        return list(range(count))
    chosen = []
    for index in requested:
        if not -count <= index < count:
            raise ValueError(f"{what} {index} does not exist: there are {count} (0 to {count - 1}, or negative)")
        chosen.append(index % count)
    return sorted(set(chosen))


def _label(token: str) -> str:
    return token.replace("$", r"\$")  # matplotlib reads $...$ as math


def require_matplotlib():
    try:
        from matplotlib.figure import Figure
    except ImportError as error:
        raise ImportError(INSTALL_HINT) from error
    return Figure


def axis_tokens(maps: dict, key: str) -> tuple[list[str], list[str]]:
    """The tokens along the rows (queries) and the columns (keys) of the `key` maps ("encoder", "decoder" or
    "cross") of an :func:`attention_maps` result."""
    return {
        "encoder": (maps["source_tokens"], maps["source_tokens"]),
        "decoder": (maps["target_tokens"], maps["decoder_input_tokens"]),
        "cross": (maps["target_tokens"], maps["source_tokens"]),
    }[key]


def draw_heatmap(ax, weights: torch.Tensor, rows: Sequence[str], columns: Sequence[str], title: str):
    """One attention map (queries x keys, weights in [0, 1]) on the matplotlib axes `ax`, tokens on the axes; the
    drawing of every heatmap of vaswani_mt. Returns the image (for a colour bar)."""
    image = ax.imshow(weights.numpy(), vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto", interpolation="nearest")
    ax.set_title(title, fontsize=9)
    ax.set_xticks(range(len(columns)), [_label(t) for t in columns], rotation=90, fontsize=7)
    ax.set_yticks(range(len(rows)), [_label(t) for t in rows], fontsize=7)
    return image


def _panel_size(rows: Sequence[str], columns: Sequence[str]) -> float:
    return min(max(2.5, 0.28 * max(len(rows), len(columns))), 9.0)


def plot_attention(model, tokenizer, sentence: str, out_dir, target: str | None = None,
                   layers: Sequence[int] | None = None, heads: Sequence[int] | None = None,
                   maps: dict | None = None, max_new_tokens: int | None = None) -> list[Path]:
    """Write attention heatmaps (PNG) for `sentence` to `out_dir`: for each selected layer (default all) one
    figure per attention kind with one panel per selected head (default all). Returns the files written, in the
    order encoder-self, decoder-self, encoder-decoder, by layer. `maps` reuses an :func:`attention_maps` result;
    `max_new_tokens` limits the greedy translation drawn when no `target` is given."""
    Figure = require_matplotlib()
    config = model.config
    selected_layers = {  # checked before any work
        "encoder": _select(layers, config.encoder_layers, "encoder layer"),
        "decoder": _select(layers, config.decoder_layers, "decoder layer"),
    }
    selected_layers["cross"] = selected_layers["decoder"]
    selected = _select(heads, min(config.encoder_attention_heads, config.decoder_attention_heads), "head")
    if maps is None:
        maps = attention_maps(model, tokenizer, sentence, target, max_new_tokens=max_new_tokens)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for kind, key in KINDS:
        weights = maps[key]
        rows, columns = axis_tokens(maps, key)
        for layer in selected_layers[key]:
            ncols = min(4, len(selected))
            nrows = -(-len(selected) // ncols)
            panel = _panel_size(rows, columns)
            figure = Figure(figsize=(ncols * panel + 1.0, nrows * panel + 0.8), layout="constrained")
            grid = figure.subplots(nrows, ncols, squeeze=False)
            for ax in grid.flat[len(selected):]:
                ax.set_axis_off()
            for ax, head in zip(grid.flat, selected):
                image = draw_heatmap(ax, weights[layer, head], rows, columns, f"head {head}")
            figure.colorbar(image, ax=grid, shrink=0.6, label="attention weight")
            figure.suptitle(f"{kind} attention, layer {layer}")
            path = out / f"{kind}_layer{layer}.png"
            figure.savefig(path, dpi=100)
            written.append(path)
    return written


def heatmap_figure(maps: dict, kind: str, layer: int, head: int | None = None):
    """One heatmap of an :func:`attention_maps` result as a matplotlib Figure: the `kind` of attention
    ("encoder-self", "decoder-self" or "encoder-decoder"), its `layer`, and one `head` or, with None, the average
    over the heads (the rows still sum to 1). Layers and heads count from 0; a negative one counts from the end."""
    Figure = require_matplotlib()
    keys = dict(KINDS)
    if kind not in keys:
        raise ValueError(f"unknown kind of attention {kind!r}: one of {', '.join(keys)}")
    key = keys[kind]
    weights = maps[key]
    layer = _select([layer], weights.shape[0], f"{kind} layer")[0]
    if head is None:
        matrix, which = weights[layer].mean(dim=0), f"average of {weights.shape[1]} heads"
    else:
        head = _select([head], weights.shape[1], "head")[0]
        matrix, which = weights[layer, head], f"head {head}"
    rows, columns = axis_tokens(maps, key)
    width = min(max(3.5, 0.3 * len(columns) + 2.2), 14.0)
    height = min(max(3.0, 0.3 * len(rows) + 1.8), 12.0)
    figure = Figure(figsize=(width, height), layout="constrained")
    ax = figure.subplots()
    image = draw_heatmap(ax, matrix, rows, columns, f"{kind} attention, layer {layer}, {which}")
    ax.set_ylabel(AXES[key][0], fontsize=8)
    ax.set_xlabel(AXES[key][1], fontsize=8)
    figure.colorbar(image, ax=ax, shrink=0.8, label="attention weight")
    return figure


def figure_png(figure, dpi: int = 100) -> bytes:
    """A matplotlib Figure as PNG bytes."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()


__all__ = ["attention_maps", "axis_tokens", "draw_heatmap", "figure_png", "heatmap_figure", "plot_attention",
           "INSTALL_HINT", "KINDS"]
