"""A small BPE tokenizer with vaswani_mt's special tokens, shared by the inference tests."""

SENTENCES = [
    "a dog runs in the park .", "two men are playing football on the grass .", "the cat sleeps on a red sofa .",
    "a woman rides a bike down the street .", "children play in the snow .", "a man is cooking dinner .",
    "ein hund rennt im park .", "zwei männer spielen fußball auf dem rasen .", "die katze schläft auf dem sofa .",
]


def make_tokenizer(vocab_size: int = 128):
    """A small BPE tokenizer with the project's special tokens (<pad>=0 <unk>=1 <s>=2 </s>=3), appending </s>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
    tok.train_from_iterator(SENTENCES, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<pad>", "<unk>", "<s>", "</s>"], show_progress=False))
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 3)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>")
