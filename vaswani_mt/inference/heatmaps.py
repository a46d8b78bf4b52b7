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
without plotting.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from ..model.pipeline_vaswani import encode_source, preprocess_text

INSTALL_HINT = 'attention heatmaps need matplotlib: pip install "vaswani-mt[plot]"'
KINDS = (("encoder-self", "encoder"), ("decoder-self", "decoder"), ("encoder-decoder", "cross"))


@torch.no_grad()
def attention_maps(model, tokenizer, sentence: str, target: str | None = None,
                   max_new_tokens: int | None = None) -> dict:
    """Attention weights of every layer and head for `sentence` translated as `target` (default: the model's
    greedy translation, at most `max_new_tokens` tokens, default source length + 50).

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
    config = model.config
    source_ids = encode_source(tokenizer, sentence, config.max_position_embeddings, config=config)
    input_ids = torch.tensor([source_ids], device=model.device)
    attention_mask = torch.ones_like(input_ids)
    was_training = model.training
    model.eval()
    try:
        if target is None:
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
    axes_tokens = {
        "encoder": (maps["source_tokens"], maps["source_tokens"]),
        "decoder": (maps["target_tokens"], maps["decoder_input_tokens"]),
        "cross": (maps["target_tokens"], maps["source_tokens"]),
    }
    written = []
    for kind, key in KINDS:
        weights = maps[key]
        rows, columns = ([_label(t) for t in tokens] for tokens in axes_tokens[key])
        for layer in selected_layers[key]:
            ncols = min(4, len(selected))
            nrows = -(-len(selected) // ncols)
            panel = min(max(2.5, 0.28 * max(len(rows), len(columns))), 9.0)
            figure = Figure(figsize=(ncols * panel + 1.0, nrows * panel + 0.8), layout="constrained")
            grid = figure.subplots(nrows, ncols, squeeze=False)
            for ax in grid.flat[len(selected):]:
                ax.set_axis_off()
            for ax, head in zip(grid.flat, selected):
                image = ax.imshow(weights[layer, head].numpy(), vmin=0.0, vmax=1.0, cmap="viridis",
                                  aspect="auto", interpolation="nearest")
                ax.set_title(f"head {head}", fontsize=9)
                ax.set_xticks(range(len(columns)), columns, rotation=90, fontsize=7)
                ax.set_yticks(range(len(rows)), rows, fontsize=7)
            figure.colorbar(image, ax=grid, shrink=0.6, label="attention weight")
            figure.suptitle(f"{kind} attention, layer {layer}")
            path = out / f"{kind}_layer{layer}.png"
            figure.savefig(path, dpi=100)
            written.append(path)
    return written


__all__ = ["attention_maps", "plot_attention", "INSTALL_HINT"]
