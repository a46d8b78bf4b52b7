"""A saved model fine-tunes as transformers' own translation example (`examples/pytorch/translation/
run_translation.py`) fine-tunes any seq2seq model: loaded through the Auto classes with `trust_remote_code`, no
vaswani_mt recipe (the package is not even importable), `Seq2SeqTrainer` with `DataCollatorForSeq2Seq` and
`predict_with_generate`. The command that runs the example itself is in docs/training.md."""

import json
import textwrap

from stock_transformers import WITHOUT_VASWANI_MT, run_without_vaswani_mt
from tiny_tokenizer import SENTENCES

# What run_translation.py does, step for step, on JSON-lines data {"translation": {"en": ..., "de": ...}}: tokenize
# sources and targets (`text_target`), pad per batch with -100 labels, train, evaluate, predict with generate().
FINE_TUNE = WITHOUT_VASWANI_MT + textwrap.dedent("""
    import json, sys
    import torch
    from datasets import load_dataset
    from transformers import (AutoModelForSeq2SeqLM, AutoTokenizer, DataCollatorForSeq2Seq, Seq2SeqTrainer,
                              Seq2SeqTrainingArguments)
    folder, data, output_dir = sys.argv[1:4]
    torch.manual_seed(0)
    model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    raw = load_dataset("json", data_files={"train": data, "validation": data})

    def preprocess(examples):
        sources = [pair["en"] for pair in examples["translation"]]
        targets = [pair["de"] for pair in examples["translation"]]
        return tokenizer(sources, text_target=targets, max_length=64, truncation=True)

    tokenized = raw.map(preprocess, batched=True, remove_columns=["translation"])
    args = Seq2SeqTrainingArguments(
        output_dir=output_dir, per_device_train_batch_size=4, per_device_eval_batch_size=4, learning_rate=3e-3,
        max_steps=40, warmup_steps=0, predict_with_generate=True, generation_max_length=24, report_to=[],
        save_strategy="no", logging_strategy="no", use_cpu=True, seed=0)
    trainer = Seq2SeqTrainer(
        model=model, args=args, train_dataset=tokenized["train"], eval_dataset=tokenized["validation"],
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100),
        processing_class=tokenizer)
    before = trainer.evaluate()["eval_loss"]
    trainer.train()
    after = trainer.evaluate()["eval_loss"]
    predictions = trainer.predict(tokenized["validation"]).predictions
    predicted = tokenizer.batch_decode(torch.tensor(predictions).clamp(min=0), skip_special_tokens=True)
    model.eval()
    batch = tokenizer([pair["en"] for pair in raw["validation"]["translation"]], return_tensors="pt", padding=True)
    with torch.no_grad():
        generated = model.generate(**batch, max_length=24)
    print(json.dumps({"class": type(model).__module__, "before": before, "after": after, "predicted": predicted,
                      "generated": tokenizer.batch_decode(generated, skip_special_tokens=True)}))
""")


def test_transformers_translation_example_path_fine_tunes_a_saved_folder_without_vaswani_mt(model, tokenizer,
                                                                                          tmp_path):
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    data = tmp_path / "train.json"
    pairs = zip(SENTENCES, SENTENCES[1:] + SENTENCES[:1])
    data.write_text("".join(json.dumps({"translation": {"en": en, "de": de}}) + "\n" for en, de in pairs))

    result = run_without_vaswani_mt(FINE_TUNE, str(folder), str(data), str(tmp_path / "out"), home=tmp_path / "hf")

    assert result["class"].startswith("transformers_modules.")
    assert result["after"] < 0.75 * result["before"]  # 5.24 -> 3.07 here
    assert result["predicted"] == result["generated"]  # predict_with_generate is the model's own generate()
    assert any(result["predicted"])
