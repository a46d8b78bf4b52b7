"""A saved checkpoint carries its code: stock transformers loads it where vaswani_mt is not installed."""

import json
import textwrap

import torch
from stock_transformers import WITHOUT_VASWANI_MT, run_without_vaswani_mt

# Runs in a fresh interpreter in which `import vaswani_mt` fails, as on a machine without the package.
LOAD_AND_GENERATE = WITHOUT_VASWANI_MT + textwrap.dedent("""
    import json, sys
    import torch
    from transformers import AutoModelForSeq2SeqLM
    path, inputs = sys.argv[1], json.loads(sys.argv[2])
    model = AutoModelForSeq2SeqLM.from_pretrained(path, trust_remote_code=True).eval()
    ids = torch.tensor(inputs["input_ids"]); mask = torch.tensor(inputs["attention_mask"])
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12)
    print(json.dumps({"class": type(model).__module__ + "." + type(model).__name__, "output": out.tolist()}))
""")


def test_fresh_process_without_vaswani_mt_loads_with_trust_remote_code_and_generates_the_same(
        make_tiny_model, padded_batch, tmp_path):
    model = make_tiny_model(norm_style="pre")
    checkpoint = tmp_path / "checkpoint"
    model.save_pretrained(checkpoint)
    inputs = {k: padded_batch[k].tolist() for k in ("input_ids", "attention_mask")}
    expected = model.generate(**{k: torch.tensor(v) for k, v in inputs.items()}, max_new_tokens=12)

    result = run_without_vaswani_mt(LOAD_AND_GENERATE, str(checkpoint), json.dumps(inputs), home=tmp_path / "hf")

    assert result["class"].startswith("transformers_modules.")
    assert result["class"].endswith("modeling_vaswani.VaswaniForConditionalGeneration")
    assert result["output"] == expected.tolist()
