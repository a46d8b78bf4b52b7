"""The web page of `vaswani-mt demo` (Gradio): type sentences, get their translations, the beam's n-best list with
scores, and the attention of any hypothesis as a heatmap (encoder-decoder, encoder self-attention, decoder
self-attention; a layer, and one head or the average of the heads).

Imported only where gradio is wanted: by `vaswani-mt demo`, by the ``app.py`` that ``vaswani-mt push --demo``
uploads for a Space, and by the tests. The work is `demo.py` (no gradio); the heatmaps are drawn by `heatmaps.py`,
as `vaswani-mt attention` draws them. The page's handlers are the methods of :class:`DemoHandlers`, plain functions
of their inputs, so they are tested without a browser.
"""

from __future__ import annotations

import io
import time

import gradio as gr
from PIL import Image

from .demo import (
    MAX_BEAMS,
    DemoError,
    decoding_defaults,
    describe_decoding,
    describe_preprocessing,
    hypothesis_attention,
    load_demo_model,
    translate_nbest,
)
from .heatmaps import KINDS, figure_png, heatmap_figure

NBEST_HEADERS = ["line", "rank", "hypothesis", "log P", "score", "tokens"]
KIND_LABELS = {"encoder-decoder": "encoder-decoder", "encoder-self": "encoder self", "decoder-self": "decoder self"}
AVERAGE = "average"


class DemoHandlers:
    """What the page's events do, for one model: each method takes the components' values and returns theirs."""

    def __init__(self, model, tokenizer):
        self.model, self.tokenizer = model, tokenizer

    def layer_choices(self, kind: str) -> list[tuple[str, int]]:
        count = self.model.config.encoder_layers if kind == "encoder-self" else self.model.config.decoder_layers
        return [(str(layer), layer) for layer in range(count)]

    def head_choices(self, kind: str) -> list[tuple[str, str]]:
        config = self.model.config
        count = config.encoder_attention_heads if kind == "encoder-self" else config.decoder_attention_heads
        return [("average of heads", AVERAGE)] + [(f"head {head}", str(head)) for head in range(count)]

    def translate(self, text: str, num_beams, length_penalty, max_length, kind: str, layer, head):
        """The Translate button: (message, translations, model input, n-best rows, hypothesis picker, results,
        heatmap). A problem with the input is the message, and the other outputs are cleared."""
        started = time.perf_counter()
        try:
            results = translate_nbest(self.model, self.tokenizer, text, num_beams=num_beams,
                                      length_penalty=length_penalty,
                                      max_new_tokens=int(max_length) if max_length else None)
        except DemoError as error:
            return (f"**{error}**", "", "", [], gr.Dropdown(choices=[], value=None), [], None)
        seconds = time.perf_counter() - started
        lines = (text or "").splitlines()
        translations = [""] * len(lines)
        model_inputs = [""] * len(lines)
        for result in results:
            translations[result.line - 1] = result.translation
            model_inputs[result.line - 1] = result.model_input
        beams = len(results[0].hypotheses)
        message = (f"{len(results)} sentence{'s' if len(results) > 1 else ''} translated in {seconds:.2f} s, "
                   f"{beams} hypothes{'i' if beams == 1 else 'e'}s each.")
        picker = gr.Dropdown(choices=self.hypothesis_choices(results), value="0:1")
        image = self.draw(results, "0:1", kind, layer, head)
        return (message, "\n".join(translations), "\n".join(model_inputs), nbest_rows(results), picker, results,
                image)

    @staticmethod
    def hypothesis_choices(results) -> list[tuple[str, str]]:
        return [(f"line {result.line}, #{hypothesis.rank} ({hypothesis.score:.3f}): {shorten(hypothesis.text)}",
                 f"{index}:{hypothesis.rank}")
                for index, result in enumerate(results) for hypothesis in result.hypotheses]

    def draw(self, results, choice: str | None, kind: str, layer, head):
        """The heatmap of hypothesis `choice` ("sentence index:rank") as a PIL image; None before any translation."""
        if not results or not choice:
            return None
        index, rank = (int(part) for part in choice.split(":"))
        maps = hypothesis_attention(self.model, self.tokenizer, results[index], rank)
        key = dict(KINDS)[kind]
        layer = min(int(layer), maps[key].shape[0] - 1)
        head = None if head in (None, AVERAGE) or int(head) >= maps[key].shape[1] else int(head)
        figure = heatmap_figure(maps, kind, layer, head)
        return Image.open(io.BytesIO(figure_png(figure)))

    def kind_changed(self, results, choice, kind: str, layer, head):
        """Another kind of attention: its layers (the last one chosen if the layer does not exist) and heads."""
        layers = self.layer_choices(kind)
        layer = layer if layer is not None and int(layer) < len(layers) else layers[-1][1]
        heads = self.head_choices(kind)
        head = head if head in [value for _, value in heads] else AVERAGE
        return (gr.Dropdown(choices=layers, value=layer), gr.Dropdown(choices=heads, value=head),
                self.draw(results, choice, kind, layer, head))


def nbest_rows(results) -> list[list]:
    """The n-best table: one row per hypothesis, scores with 3 decimals."""
    return [[result.line, hypothesis.rank, hypothesis.text, f"{hypothesis.log_prob:.3f}", f"{hypothesis.score:.3f}",
             " ".join(hypothesis.tokens)] for result in results for hypothesis in result.hypotheses]


def shorten(text: str, width: int = 48) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def build_demo(model, tokenizer, name: str = "model") -> gr.Blocks:
    """The page for `model` (what `vaswani-mt demo` serves); launch it with ``.launch(...)``."""
    handlers = DemoHandlers(model, tokenizer)
    config = model.config
    defaults = decoding_defaults(model)
    preprocessing = describe_preprocessing(model)
    languages = " → ".join(filter(None, (getattr(config, "source_lang", None), getattr(config, "target_lang", None))))
    about = [f"**{name}**" + (f" ({languages})" if languages else "")
             + f": {config.encoder_layers}+{config.decoder_layers} layers, {config.encoder_attention_heads} heads, "
             f"d_model {config.d_model}, {config.vocab_size:,} subwords, at most {config.max_position_embeddings} "
             "tokens per sentence.",
             f"Decoding defaults: {describe_decoding(model)}."]
    if preprocessing:
        about.append(f"This model reads {preprocessing} text: each line is {preprocessing} first, as shown below, "
                     "and its output is such text too.")
    default_kind = "encoder-decoder"
    with gr.Blocks(title=f"vaswani-mt demo: {name}", analytics_enabled=False) as demo:
        gr.Markdown("## vaswani-mt demo\n" + "  \n".join(about), elem_id="about")
        results = gr.State([])
        with gr.Row():
            with gr.Column(scale=3):
                source = gr.Textbox(label="Source text (one sentence per line)", lines=3, elem_id="source",
                                    placeholder="Type one or more sentences, one per line.")
                with gr.Row():
                    num_beams = gr.Slider(1, MAX_BEAMS, value=defaults["num_beams"], step=1, label="Beam size",
                                          elem_id="num-beams")
                    length_penalty = gr.Slider(0.0, 2.0, value=defaults["length_penalty"], step=0.05,
                                               label="Length penalty α", elem_id="length-penalty")
                    max_length = gr.Slider(0, config.max_position_embeddings, value=defaults["max_new_tokens"] or 0,
                                           step=1, label="Max. tokens (0: source + 50)",
                                           elem_id="max-length")
                button = gr.Button("Translate", variant="primary", elem_id="translate")
                message = gr.Markdown("", elem_id="message")
                translation = gr.Textbox(label="Translation (one line per source line)", lines=3, interactive=False,
                                         elem_id="translation")
                model_input = gr.Textbox(label=f"What the model reads ({preprocessing})", lines=2,
                                         interactive=False, visible=preprocessing is not None, elem_id="model-input")
            with gr.Column(scale=2):
                hypothesis = gr.Dropdown(choices=[], value=None, label="Hypothesis", elem_id="hypothesis")
                with gr.Row():
                    kind = gr.Dropdown(choices=[(label, value) for value, label in KIND_LABELS.items()],
                                       value=default_kind, label="Attention", elem_id="kind", scale=2, min_width=120)
                    layer = gr.Dropdown(choices=handlers.layer_choices(default_kind),
                                        value=config.decoder_layers - 1, label="Layer", elem_id="layer", scale=1,
                                        min_width=90)
                    head = gr.Dropdown(choices=handlers.head_choices(default_kind), value=AVERAGE, label="Head",
                                       elem_id="head", scale=2, min_width=120)
                heatmap = gr.Image(label="Attention of the hypothesis", show_label=False, type="pil", format="png",
                                   interactive=False, elem_id="heatmap")
        nbest = gr.Dataframe(headers=NBEST_HEADERS, datatype=["number", "number", "str", "str", "str", "str"],
                             value=[], interactive=False, wrap=True, elem_id="nbest",
                             column_widths=["6%", "6%", "38%", "9%", "9%", "32%"],
                             label="The beam's n-best list (log P: log-probability; score: log P / length penalty, "
                                   "what the beam ranks by)")
        button.click(handlers.translate, [source, num_beams, length_penalty, max_length, kind, layer, head],
                     [message, translation, model_input, nbest, hypothesis, results, heatmap], api_name="translate")
        for picker in (hypothesis, layer, head):
            picker.input(handlers.draw, [results, hypothesis, kind, layer, head], heatmap, api_visibility="private")
        kind.input(handlers.kind_changed, [results, hypothesis, kind, layer, head], [layer, head, heatmap],
                   api_visibility="private")
    return demo


def app_for(name: str, device: str | None = None) -> gr.Blocks:
    """The page for the model `name` (a folder or a Hub id): what the Space's ``app.py`` serves."""
    model, tokenizer = load_demo_model(name, device)
    return build_demo(model, tokenizer, name=name)


__all__ = ["DemoHandlers", "app_for", "build_demo", "nbest_rows"]
