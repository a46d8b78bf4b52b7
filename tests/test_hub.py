"""Issue #6: push a trained model to the Hub with its model card, and the user's round trip, all offline.

A fake Hub (`tests/hub_server.py`, standard library only) runs on 127.0.0.1 for the module. Every client step runs in
a fresh subprocess with `HF_ENDPOINT` pointing at it, `HF_HUB_DISABLE_XET=1`, a fake `HF_TOKEN` and an empty
`HF_HOME` (huggingface_hub reads the endpoint once, at import). The user's steps run where `import vaswani_mt` fails,
as on a machine without the package, and execute the code blocks of the model card that was pushed:

a. `vaswani-mt push` uploads a run folder's model/ and README.md, and nothing else;
b. `AutoModelForSeq2SeqLM.from_pretrained(repo, trust_remote_code=True)` gives the same weights and beam search;
c. `pipeline("translation", model=repo, trust_remote_code=True)` translates as the pushed model does;
d. the card's fine-tuning code (stock `Seq2SeqTrainer` + `DataCollatorForSeq2Seq`) lowers the loss, saves, and the
   saved folder loads again;
e. `VaswaniTrainer(push_to_hub=True)` uploads our card and the model + pipeline code, at checkpoints and at the end;
f. errors: no token, someone else's namespace, read-only or invalid token, incomplete run folder: one line, no upload.

Plus unit tests of `render_model_card`: the metadata parses with huggingface_hub, the numbers are metrics.json's, a
missing metric is left out.
"""

import copy
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent
if str(TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR))

from hub_server import READY_PREFIX, read_state, repo_files  # noqa: E402
from hub_server import requests as server_requests  # noqa: E402
from stock_transformers import WITHOUT_VASWANI_MT  # noqa: E402
from tiny_tokenizer import make_tokenizer  # noqa: E402

ALICE = "hf_fake_alice_write"
ALICE_READ_ONLY = "hf_fake_alice_read"
BOB = "hf_fake_bob_write"
REPO = "alice/vaswani-tiny-en-de"
SOURCES = ["a dog runs in the park .", "the cat sleeps on a red sofa .", "Two children are playing in the snow."]
MODEL_FILES = {"config.json", "configuration_vaswani.py", "generation_config.json", "model.safetensors", "modeling_vaswani.py", "pipeline_vaswani.py", "tokenizer.json",
               "tokenizer_config.json"}
CLIENT_TIMEOUT = 300



# --- the run folder a push starts from --------------------------------------------------------------------------------

# the data description of the shipped Multi30k config: the card's Multi30k licence, domain and citation come from it
MULTI30K_DESCRIPTION = yaml.safe_load((REPO_ROOT / "vaswani_mt" / "configs" / "multi30k-en-de.yaml").read_text(
    encoding="utf-8"))["data"]["description"]
RUN_CONFIG = {
    "data": {"path": "../shared/data/multi30k", "source_lang": "en", "target_lang": "de", "train_split": "train",
             "valid_split": "valid", "test_split": "test2016", "valid_subset": None, "max_length": 128,
             "drop_duplicates": False, "description": MULTI30K_DESCRIPTION},
    "tokenizer": {"path": None, "vocab_size": 128, "min_frequency": 2},
    "model": {"preset": "tiny", "config": {"dropout": 0.3}},
    "training": {"max_tokens": 4096, "gradient_accumulation_steps": 1, "max_steps": None, "num_epochs": 60.0,
                 "max_minutes": 85.0, "warmup_steps": 800, "noam_factor": 0.5, "label_smoothing": 0.1,
                 "adam_beta1": 0.9, "adam_beta2": 0.98, "adam_epsilon": 1e-09, "weight_decay": 0.0,
                 "max_grad_norm": 0.0, "eval_steps": 500, "logging_steps": 50, "keep_checkpoints": 5,
                 "average_last": 5, "num_beams": 4, "seed": 1, "num_threads": None, "bf16": True},
    "output_dir": "runs/multi30k-en-de",
    "quick": {},
}
SIGNATURES = {
    "bleu": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0",
    "chrf": "nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:2.6.0",
    "lc": "nrefs:1|case:lc|eff:no|tok:none|smooth:exp|version:2.6.0",
}


def run_metrics(parameters: int) -> dict:
    """A metrics.json as `vaswani-mt train` writes it, with unround numbers."""
    return {
        "command": "vaswani-mt train --config multi30k-en-de",
        "training": {"steps": 4371, "epochs": 59.87, "wall_seconds_this_process": 5093.2,
                     "train_runtime_seconds": 5090.4412, "target_tokens_per_second_median": 3120.7,
                     "final_train_loss": 2.0713421, "world_size": 1,
                     "hardware": {"cpu": "AMD EPYC 9R45", "cpu_count": 2, "torch_threads": 2, "cuda": False,
                                  "torch": "2.13.0+cpu"}},
        "model": {"preset": "tiny", "parameters": parameters, "config": {"d_model": 32}},
        "data": {
            "train": {"split": "train", "filtered": True, "pairs_in": 29000, "pairs_out": 28996, "html_unescaped": 17,
                      "text_normalized": 131, "dropped": {"empty": 2, "target_is_noise": 2}, "kept_despite": {}},
            "valid": {"split": "valid", "filtered": False, "pairs_in": 1014, "pairs_out": 1014, "html_unescaped": 0,
                      "text_normalized": 1, "dropped": {}, "kept_despite": {}},
            "test2016": {"split": "test2016", "filtered": False, "pairs_in": 1000, "pairs_out": 1000,
                         "html_unescaped": 0, "text_normalized": 0, "dropped": {}, "kept_despite": {}},
        },
        "selection": {"chosen": "averaged", "best_checkpoint": "runs/multi30k-en-de/checkpoints/checkpoint-4000",
                      "valid_bleu_best_checkpoint": 36.0185, "averaged_checkpoints": [
                          "checkpoint-2500", "checkpoint-3000", "checkpoint-3500", "checkpoint-4000",
                          "checkpoint-4371"], "valid_bleu_averaged": 36.9872},
        "bleu_signatures_during_training": {"bleu": SIGNATURES["bleu"], "chrf": SIGNATURES["chrf"]},
        "test": {"split": "test2016", "sentences": 1000, "bleu": 35.41234, "bleu_signature": SIGNATURES["bleu"],
                 "chrf": 62.098765, "chrf_signature": SIGNATURES["chrf"],
                 "bleu_lowercased_moses_tokenized": 36.87311,
                 "bleu_lowercased_moses_tokenized_signature": SIGNATURES["lc"], "num_beams": 4, "seconds": 61.3},
    }


def make_run_folder(root: Path, model, tokenizer, metrics: dict | None = None) -> Path:
    """A run folder as `vaswani-mt train` leaves it: model/ (via save_for_pipeline), config.yaml, metrics.json, and
    things that must not be uploaded (checkpoints, logs, test output)."""
    from vaswani_mt import save_for_pipeline

    run = root / "multi30k-en-de"
    save_for_pipeline(model, tokenizer, run / "model")
    (run / "config.yaml").write_text(yaml.safe_dump(RUN_CONFIG, sort_keys=False), encoding="utf-8")
    metrics = run_metrics(model.num_parameters()) if metrics is None else metrics
    (run / "metrics.json").write_text(json.dumps(metrics, indent=2), encoding="utf-8")
    checkpoint = run / "checkpoints" / "checkpoint-4371"
    checkpoint.mkdir(parents=True)
    (checkpoint / "optimizer.pt").write_bytes(b"not for the hub")
    (run / "train.log").write_text("training log\n", encoding="utf-8")
    (run / "test.hyp").write_text("ein hund\n", encoding="utf-8")
    return run


def tiny_model(tokenizer, seed: int = 0):
    from vaswani_mt import VaswaniConfig, VaswaniForConditionalGeneration

    torch.manual_seed(seed)
    config = VaswaniConfig.from_preset("tiny", vocab_size=len(tokenizer), dropout=0.3)
    return VaswaniForConditionalGeneration(config).eval()


def weight_hashes(model) -> dict[str, str]:
    return {name: hashlib.sha256(tensor.detach().contiguous().numpy().tobytes()).hexdigest()
            for name, tensor in model.state_dict().items()}


# --- the fake Hub and its clients -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """The fake Hub on 127.0.0.1 (port chosen by the OS), stopped with SIGTERM after the module."""
    storage = tmp_path_factory.mktemp("hub-storage")
    log = open(storage.parent / "hub-server.stderr", "w", encoding="utf-8")
    process = subprocess.Popen([sys.executable, str(TESTS_DIR / "hub_server.py"), "--port", "0", "--storage",
                                str(storage)], stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        line = process.stdout.readline()
        assert line.startswith(READY_PREFIX), f"the fake hub did not start: {line!r}"
        url = line[len(READY_PREFIX):].strip()
        assert url.startswith("http://127.0.0.1:")
        yield SimpleNamespace(url=url, storage=storage, stderr=Path(log.name))
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


def client_env(hub, home: Path, token: str | None = ALICE) -> dict:
    """A client's environment: the fake Hub, no Xet, `token` as HF_TOKEN (none if None), an empty HF_HOME, and no
    other Hugging Face setting of the test process (such as conftest's HF_HUB_OFFLINE)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_", "TRANSFORMERS_"))}
    home.mkdir(parents=True, exist_ok=True)
    env.update(HF_ENDPOINT=hub.url, HF_HUB_DISABLE_XET="1", HF_HUB_DISABLE_TELEMETRY="1", HF_HOME=str(home),
               TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    if token is not None:
        env["HF_TOKEN"] = token
    return env


def run_client(args: list[str], env: dict, cwd: Path) -> subprocess.CompletedProcess:
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=CLIENT_TIMEOUT)


def run_script(script: str, env: dict, cwd: Path, *args: str) -> dict:
    """Run a Python script (with `args` as sys.argv[1:]) in a fresh interpreter; return the JSON it prints last."""
    result = run_client(["-c", script, *args], env, cwd)
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def push_cli(hub, home: Path, run_dir: Path, repo_id: str, *extra: str, token: str | None = ALICE):
    return run_client(["-m", "vaswani_mt.cli", "push", str(run_dir), repo_id, *extra],
                      client_env(hub, home / "hf", token), home)


def card_code(card: str, marker: str) -> str:
    """The card's Python code block that contains `marker`."""
    blocks = [block for block in re.findall(r"```python\n(.*?)```", card, flags=re.S) if marker in block]
    assert len(blocks) == 1, f"expected one code block with {marker!r} in the card"
    return blocks[0]


def commits_to(hub, repo_id: str) -> list[dict]:
    return [r for r in server_requests(hub.storage) if r["method"] == "POST" and repo_id in r["path"]
            and ("/commit/" in r["path"] or "/preupload/" in r["path"] or r["path"].endswith("/objects/batch"))]


# --- a. push ----------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pushed(hub, tmp_path_factory):
    """A run folder pushed with `vaswani-mt push` (in a subprocess); the in-process model's outputs to compare with."""
    root = tmp_path_factory.mktemp("push")
    tokenizer = make_tokenizer()
    model = tiny_model(tokenizer)
    run_dir = make_run_folder(root, model, tokenizer)
    result = push_cli(hub, root, run_dir, REPO)
    assert result.returncode == 0, result.stderr[-4000:]
    expected = {}
    with torch.no_grad():
        for text in SOURCES:  # one sentence at a time, as the pipeline runs them
            ids = model.generate(**tokenizer([text], return_tensors="pt"))[0]
            expected[text] = {"ids": ids.tolist(), "text": tokenizer.decode(ids, skip_special_tokens=True)}
    return SimpleNamespace(run_dir=run_dir, stdout=result.stdout, model=model, tokenizer=tokenizer,
                           weights=weight_hashes(model), expected=expected,
                           card=repo_files(hub.storage, REPO)["README.md"].decode("utf-8"))


def test_push_uploads_the_model_folder_and_the_card_in_one_commit_and_nothing_else(hub, pushed):
    from vaswani_mt.publishing.model_card import render_model_card

    files = repo_files(hub.storage, REPO)
    assert set(files) == MODEL_FILES | {"README.md", ".gitattributes"}
    for name in MODEL_FILES:
        assert files[name] == (pushed.run_dir / "model" / name).read_bytes(), name
    assert files["README.md"].decode("utf-8") == render_model_card(pushed.run_dir, REPO)
    repo = read_state(hub.storage)["repos"][f"model/{REPO}"]
    assert len(repo["history"]) == 2  # the repo's initial commit, then the push
    head = repo["commits"][repo["branches"]["main"]]
    assert head["files"]["model.safetensors"].get("lfs"), "the weights go through LFS"
    assert not head["files"]["README.md"].get("lfs")
    assert not repo["private"]
    assert f"{hub.url}/{REPO}" in pushed.stdout


def test_stock_from_pretrained_without_vaswani_mt_gives_the_same_weights_and_beam_search(hub, pushed, tmp_path):
    script = WITHOUT_VASWANI_MT + card_code(pushed.card, "model.generate") + textwrap.dedent(f"""
        import hashlib, json
        sources = {json.dumps(SOURCES)}
        weights = {{name: hashlib.sha256(t.detach().contiguous().numpy().tobytes()).hexdigest()
                   for name, t in model.state_dict().items()}}
        ids = [model.generate(**tokenizer([text], return_tensors="pt"))[0].tolist() for text in sources]
        print(json.dumps({{"class": type(model).__module__ + "." + type(model).__name__, "training": model.training,
                          "weights": weights, "ids": ids, "snippet_ids": outputs[0].tolist()}}))
    """)
    out = run_script(script, client_env(hub, tmp_path / "hf"), tmp_path)

    assert out["class"].startswith("transformers_modules.")
    assert out["class"].endswith("modeling_vaswani.VaswaniForConditionalGeneration")
    assert out["training"] is False
    assert out["weights"] == pushed.weights
    assert out["ids"] == [pushed.expected[text]["ids"] for text in SOURCES]
    assert out["snippet_ids"] == pushed.expected[SOURCES[2]]["ids"]  # the card's example sentence


def test_stock_translation_pipeline_without_vaswani_mt_translates_as_the_pushed_model(hub, pushed, tmp_path):
    script = WITHOUT_VASWANI_MT + card_code(pushed.card, "translator = pipeline(") + textwrap.dedent(f"""
        import json
        print(json.dumps({{"class": type(translator).__module__ + "." + type(translator).__name__,
                          "one": translator({json.dumps(SOURCES[0])}),
                          "many": translator({json.dumps(SOURCES)})}}))
    """)
    out = run_script(script, client_env(hub, tmp_path / "hf"), tmp_path)

    assert out["class"].startswith("transformers_modules.")
    assert out["class"].endswith("pipeline_vaswani.TranslationPipeline")
    assert out["one"] == [{"translation_text": pushed.expected[SOURCES[0]]["text"]}]
    assert out["many"] == [{"translation_text": pushed.expected[text]["text"]} for text in SOURCES]


def test_the_cards_fine_tuning_code_lowers_the_loss_and_the_saved_model_loads_again(hub, pushed, tmp_path):
    script = WITHOUT_VASWANI_MT + card_code(pushed.card, "Seq2SeqTrainer(") + textwrap.dedent(f"""
        import hashlib, json, torch
        from transformers import pipeline

        def hashes(m):
            return {{n: hashlib.sha256(t.detach().cpu().contiguous().numpy().tobytes()).hexdigest()
                    for n, t in m.state_dict().items()}}

        original = AutoModelForSeq2SeqLM.from_pretrained({json.dumps(REPO)}, trust_remote_code=True).eval()
        reloaded = AutoModelForSeq2SeqLM.from_pretrained("finetuned", trust_remote_code=True).eval()
        batch = DataCollatorForSeq2Seq(tokenizer, model=original)([train_dataset[i] for i in range(len(pairs))])
        with torch.no_grad():
            before, after = original(**batch).loss.item(), reloaded(**batch).loss.item()
        translator = pipeline("translation", model="finetuned", trust_remote_code=True)
        print(json.dumps({{"before": before, "after": after, "steps": trainer.state.global_step,
                          "reloaded_class": type(reloaded).__module__,
                          "same_weights": hashes(reloaded) == hashes(trainer.model),
                          "changed": hashes(reloaded) != hashes(original),
                          "pipeline": translator({json.dumps(SOURCES[0])})}}))
    """)
    out = run_script(script, client_env(hub, tmp_path / "hf"), tmp_path)

    assert out["steps"] > 0
    assert out["after"] < out["before"], out
    assert out["reloaded_class"].startswith("transformers_modules.")
    assert out["same_weights"] and out["changed"]
    assert set(out["pipeline"][0]) == {"translation_text"}
    for name in ("model.safetensors", "config.json", "modeling_vaswani.py", "pipeline_vaswani.py", "tokenizer.json"):
        assert (tmp_path / "finetuned" / name).is_file(), name


# --- e. VaswaniTrainer(push_to_hub=True) ------------------------------------------------------------------------------

TRAINER_PUSH = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, sys.argv[4])
    import torch
    from datasets import Dataset
    from transformers import DataCollatorForSeq2Seq
    from tiny_tokenizer import SENTENCES, make_tokenizer
    from vaswani_mt import VaswaniConfig, VaswaniForConditionalGeneration, VaswaniTrainer, VaswaniTrainingArguments

    output_dir, repo_id, token = sys.argv[1:4]
    tokenizer = make_tokenizer()
    torch.manual_seed(0)
    model = VaswaniForConditionalGeneration(VaswaniConfig.from_preset("tiny"))
    pairs = list(zip(SENTENCES[:6], SENTENCES[3:9]))
    dataset = Dataset.from_dict({"src": [s for s, _ in pairs], "tgt": [t for _, t in pairs]}).map(
        lambda b: tokenizer(b["src"], text_target=b["tgt"]), batched=True, remove_columns=["src", "tgt"])
    args = VaswaniTrainingArguments(
        output_dir=output_dir, max_steps=4, warmup_steps=2, per_device_train_batch_size=3, logging_steps=1,
        save_strategy="steps", save_steps=2, report_to=[], use_cpu=True, disable_tqdm=True,
        predict_with_generate=False, push_to_hub=True, hub_model_id=repo_id, hub_token=token)
    trainer = VaswaniTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer,
                             data_collator=DataCollatorForSeq2Seq(tokenizer, model=model))
    trainer.train()
    commit = trainer.push_to_hub(language=["en", "de"])
    print(json.dumps({"commit": str(commit), "steps": trainer.state.global_step,
                      "parameters": model.num_parameters()}))
""")


def test_trainer_push_to_hub_uploads_our_card_and_the_model_and_pipeline_code(hub, tmp_path):
    from huggingface_hub import ModelCard

    repo_id = "alice/vaswani-trainer-push"
    env = client_env(hub, tmp_path / "hf", token=None)  # the token comes from hub_token
    out = run_script(TRAINER_PUSH, env, tmp_path, str(tmp_path / "out"), repo_id, ALICE, str(TESTS_DIR))

    files = repo_files(hub.storage, repo_id)
    assert MODEL_FILES | {"README.md"} <= set(files)
    assert not [name for name in files if name.startswith("checkpoint-")]
    config = json.loads(files["config.json"])
    assert config["auto_map"]["AutoModelForSeq2SeqLM"] == "modeling_vaswani.VaswaniForConditionalGeneration"
    assert config["custom_pipelines"]["translation"]["impl"] == "pipeline_vaswani.TranslationPipeline"
    card = ModelCard(files["README.md"].decode("utf-8"))
    data = card.data.to_dict()
    assert data["library_name"] == "transformers" and data["pipeline_tag"] == "translation"
    assert {"vaswani_mt", "translation"} <= set(data["tags"])
    assert data["language"] == ["en", "de"]
    assert "model-index" not in data  # no test score exists for these weights
    assert f"| Updates | {out['steps']} |" in card.text
    assert f"| Parameters | {out['parameters']:,} |" in card.text

    # The checkpoint pushes during training carry the card and the code too (the stock Trainer copies only weights).
    repo = read_state(hub.storage)["repos"][f"model/{repo_id}"]
    titles = [repo["commits"][oid]["title"] for oid in repo["history"]]
    assert "Training in progress, step 2" in titles and titles[-1] == "End of training"
    first_push = repo["commits"][repo["history"][titles.index("Training in progress, step 2")]]
    assert {"README.md", "modeling_vaswani.py", "pipeline_vaswani.py", "model.safetensors"} <= set(first_push["files"])


# --- f. errors --------------------------------------------------------------------------------------------------------

# Every refused push, plus a dry run, goes through the `vaswani-mt` entry point in ONE fresh process (importing
# vaswani_mt once instead of per case keeps this module fast); stdout, stderr and the exit code are kept per case, and
# so is the number of requests the fake Hub received meanwhile.
CLI_CASES = textwrap.dedent("""
    import contextlib, io, json, os, sys
    from pathlib import Path
    from vaswani_mt.cli import main

    log, cases = Path(sys.argv[1]), json.loads(sys.argv[2])
    count = lambda: len(log.read_text().splitlines()) if log.exists() else 0
    results = {}
    for name, case in cases.items():
        os.environ.pop("HF_TOKEN", None)
        if case["token"]:
            os.environ["HF_TOKEN"] = case["token"]
        stdout, stderr, before = io.StringIO(), io.StringIO(), count()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            code = main(["push", *case["args"]])
        results[name] = {"code": code, "stdout": stdout.getvalue(), "stderr": stderr.getvalue(),
                         "requests": count() - before}
    print(json.dumps(results))
""")
REFUSALS = {  # case -> (token, repo id, phrases the one-line message must contain)
    "no token": (None, "alice/no-token", ["no Hugging Face token", "hf auth login", "HF_TOKEN"]),
    "someone else's repo": (ALICE, "bob/his-model", ["cannot push to bob/his-model", "belongs to someone else",
                                                     "'alice'"]),
    "someone else's namespace": (ALICE, "bob/new-model", ["cannot push to bob/new-model", "belongs to someone else"]),
    "read-only token": (ALICE_READ_ONLY, "alice/read-only", ["read-only", "write access", "hf auth login"]),
    "invalid token": ("hf_not_a_real_token", "alice/bad-token", ["rejected the token", "hf auth login"]),
}


@pytest.fixture(scope="module")
def bobs_repo(hub, tmp_path_factory):
    """A repo that bob created; returns its commit history."""
    home = tmp_path_factory.mktemp("bob")
    script = "from huggingface_hub import HfApi; print(HfApi().create_repo('bob/his-model').repo_id)"
    result = run_client(["-c", script], client_env(hub, home / "hf", BOB), home)
    assert result.returncode == 0, result.stderr[-3000:]
    return read_state(hub.storage)["repos"]["model/bob/his-model"]["history"]


@pytest.fixture(scope="module")
def cli_runs(hub, pushed, bobs_repo, tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    incomplete = root / "incomplete-run"
    shutil.copytree(pushed.run_dir, incomplete)
    for name in ("model/model.safetensors", "model/tokenizer.json", "model/tokenizer_config.json", "metrics.json",
                 "model/configuration_vaswani.py"):
        (incomplete / name).unlink()
    cases = {name: {"token": token, "args": [str(pushed.run_dir), repo_id]}
             for name, (token, repo_id, _) in REFUSALS.items()}
    cases["incomplete run folder"] = {"token": ALICE, "args": [str(incomplete), "alice/incomplete"]}
    cases["dry run"] = {"token": None, "args": [str(pushed.run_dir), REPO, "--dry-run"]}
    cases["private push"] = {"token": ALICE, "args": [str(pushed.run_dir), "private-model", "--private"]}
    return run_script(CLI_CASES, client_env(hub, root / "hf", token=None), root,
                      str(hub.storage / "requests.jsonl"), json.dumps(cases))


@pytest.mark.parametrize("case", list(REFUSALS))
def test_a_push_that_cannot_work_stops_with_one_clear_line_before_any_upload(hub, cli_runs, bobs_repo, case):
    _, repo_id, phrases = REFUSALS[case]
    run = cli_runs[case]

    assert run["code"] == 1
    lines = run["stderr"].strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vaswani-mt push: error: "), run["stderr"]
    for phrase in phrases:
        assert phrase in lines[0], lines[0]
    assert run["requests"] <= 1  # at most the token check (whoami): no repo creation, no upload
    assert commits_to(hub, repo_id) == []
    repos = read_state(hub.storage)["repos"]
    assert f"model/{repo_id}" not in repos or repo_id == "bob/his-model"
    assert repos["model/bob/his-model"]["history"] == bobs_repo


def test_an_incomplete_run_folder_is_refused_naming_what_is_missing_before_any_request(cli_runs):
    run = cli_runs["incomplete run folder"]

    assert run["code"] == 2
    lines = run["stderr"].strip().splitlines()
    assert len(lines) == 1, run["stderr"]
    for missing in ("model/model.safetensors", "model/tokenizer.json", "metrics.json", "model/configuration_vaswani.py"):
        assert missing in lines[0]
    assert "config.yaml" not in lines[0]  # present, so not named
    assert run["requests"] == 0  # refused before even checking the token


def test_dry_run_prints_the_card_and_the_files_says_nothing_was_uploaded_and_sends_nothing(cli_runs):
    run = cli_runs["dry run"]

    assert run["code"] == 0, run["stderr"]
    assert run["stdout"].startswith("---\nlanguage:")
    files, said = run["stderr"].strip().splitlines()[-2:]
    assert files == "files: " + ", ".join(sorted(MODEL_FILES | {"README.md"}))
    assert said.startswith("dry run: nothing was uploaded;") and said.endswith(REPO)
    assert run["requests"] == 0


def test_hub_refusals_after_the_checks_become_one_line_errors():
    """A 403 or 401 from create_repo/commit (e.g. a fine-grained token without write scope) is reported clearly."""
    from huggingface_hub.errors import HfHubHTTPError

    from vaswani_mt.publishing.hub import PushError, _hub_errors

    def refusal(status, message):
        response = SimpleNamespace(status_code=status, headers={"X-Error-Message": message}, request=None,
                                   json=lambda: {"error": message})
        return HfHubHTTPError(f"{status} Client Error", response=response)

    with pytest.raises(PushError, match=r"cannot push to bob/x: the Hub refused write access \(403: not yours\)"):
        with _hub_errors("bob/x", "http://127.0.0.1:1"):
            raise refusal(403, "not yours")
    with pytest.raises(PushError, match="refused the token: log in with `hf auth login`"):
        with _hub_errors("bob/x", "http://127.0.0.1:1"):
            raise refusal(401, "Invalid credentials in Authorization header")


def test_push_without_network_is_one_line_not_an_http_client_traceback(tmp_path_factory):
    """The token check is the first request; a Hub that cannot be reached (here a closed port) must not surface as the
    HTTP client's ConnectError traceback."""
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}"
    root = tmp_path_factory.mktemp("offline")
    tokenizer = make_tokenizer()
    run_dir = make_run_folder(root, tiny_model(tokenizer), tokenizer)
    result = push_cli(SimpleNamespace(url=closed), root, run_dir, "alice/offline")
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"vaswani-mt push: error: cannot reach the Hub at {closed}: ")


# --- the model card ---------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    tokenizer = make_tokenizer()
    return make_run_folder(tmp_path_factory.mktemp("card"), tiny_model(tokenizer), tokenizer)


def with_metrics(run_dir: Path, tmp_path: Path, change) -> Path:
    copy_dir = tmp_path / run_dir.name
    shutil.copytree(run_dir, copy_dir)
    metrics = json.loads((copy_dir / "metrics.json").read_text())
    change(metrics)
    (copy_dir / "metrics.json").write_text(json.dumps(metrics))
    return copy_dir


def test_card_metadata_parses_with_huggingface_hub_and_its_scores_are_those_of_metrics_json(run_dir):
    from huggingface_hub import ModelCard
    from huggingface_hub.repocard_data import model_index_to_eval_results

    from vaswani_mt.publishing.model_card import render_model_card

    card = ModelCard(render_model_card(run_dir, REPO))
    data = card.data.to_dict()
    metrics = json.loads((run_dir / "metrics.json").read_text())
    test = metrics["test"]

    assert data["language"] == ["en", "de"]
    assert data["license"] == "other"
    assert data["license_name"] == "multi30k-non-commercial-research"
    assert data["license_link"] == "https://github.com/multi30k/dataset"
    assert data["library_name"] == "transformers" and data["pipeline_tag"] == "translation"
    assert {"translation", "transformer", "vaswani_mt"} <= set(data["tags"])
    assert data["datasets"] == ["multi30k"]
    assert data["metrics"] == ["bleu", "chrf"]

    name, results = model_index_to_eval_results(data["model-index"])
    assert name == "vaswani-tiny-en-de"
    assert card.data.eval_results is not None and len(card.data.eval_results) == 3
    by_signature = {r.metric_args["signature"]: r for r in results}
    assert by_signature[test["bleu_signature"]].metric_value == test["bleu"]
    assert by_signature[test["bleu_signature"]].metric_type == "bleu"
    assert by_signature[test["chrf_signature"]].metric_value == test["chrf"]
    assert by_signature[test["chrf_signature"]].metric_type == "chrf"
    lowercased = by_signature[test["bleu_lowercased_moses_tokenized_signature"]]
    assert lowercased.metric_value == test["bleu_lowercased_moses_tokenized"]
    for result in results:
        assert result.task_type == "translation"
        assert (result.dataset_type, result.dataset_split, result.dataset_config) == ("multi30k", "test2016", "en-de")
        assert result.metric_args["num_beams"] == test["num_beams"]
        assert result.metric_args["sentences"] == test["sentences"]


def test_card_body_reports_the_runs_numbers(run_dir):
    from vaswani_mt.publishing.model_card import render_model_card

    text = render_model_card(run_dir, REPO)
    metrics = json.loads((run_dir / "metrics.json").read_text())
    model_config = json.loads((run_dir / "model" / "config.json").read_text())

    assert "**Test result:** BLEU 35.41 and chrF 62.10 on Multi30k test2016 (1,000 sentences, beam 4)" in text
    assert "| BLEU (sacreBLEU: cased, 13a tokenization, detokenized output) | 35.41 | `nrefs:1\\|case:mixed" in text
    assert "| BLEU, lowercased and Moses-tokenized (sacreBLEU, tok:none) | 36.87 |" in text
    assert f"| Parameters | {metrics['model']['parameters']:,} |" in text
    assert f"| d_model | {model_config['d_model']} |" in text
    assert f"| Dropout (P_drop) | {model_config['dropout']} |" in text
    assert "| Layer norm | post-norm" in text
    assert "| `train` | 29,000 | 28,996 | 4 (empty: 2, target_is_noise: 2) | 17 | 131 |" in text
    assert "| Updates | 4,371 |" in text
    assert "| Training time | 1 h 25 min (evaluations included) |" in text
    assert "| Throughput | 3,121 target tokens per second" in text
    assert "| Hardware | AMD EPYC 9R45, 2 cores; 2 torch threads; no GPU; torch 2.13.0+cpu |" in text
    assert "Noam schedule" in text and "800 warm-up steps, factor 0.5" in text
    assert "average of the last 5 checkpoints" in text and "validation BLEU 36.99" in text
    assert "non-commercial research" in text and "@inproceedings{elliott-etal-2016-multi30k" in text
    # the three ways in, with the repo id filled in
    assert f'AutoModelForSeq2SeqLM.from_pretrained("{REPO}", trust_remote_code=True)' in text
    assert f'pipeline("translation", model="{REPO}", trust_remote_code=True)' in text
    assert "Seq2SeqTrainer(" in text and "DataCollatorForSeq2Seq(" in text
    assert "{{" not in text  # no placeholder left


def test_a_missing_metric_is_left_out_of_the_card_not_invented(run_dir, tmp_path):
    from huggingface_hub import ModelCard

    from vaswani_mt.publishing.model_card import render_model_card

    def drop_chrf(metrics):
        del metrics["test"]["chrf"], metrics["test"]["chrf_signature"]
        metrics["training"].pop("target_tokens_per_second_median")

    card = ModelCard(render_model_card(with_metrics(run_dir, tmp_path / "no-chrf", drop_chrf), REPO))
    assert [r.metric_type for r in card.data.eval_results] == ["bleu", "bleu"]
    assert card.data.to_dict()["metrics"] == ["bleu"]
    assert "chrF" not in card.text and "Throughput" not in card.text
    assert "**Test result:** BLEU 35.41 on Multi30k test2016" in card.text

    card = ModelCard(render_model_card(with_metrics(run_dir, tmp_path / "no-test", lambda m: m.pop("test")), REPO))
    data = card.data.to_dict()
    assert "model-index" not in data and "metrics" not in data and card.data.eval_results is None
    assert "## Results" not in card.text and "Test result" not in card.text
    assert "The run recorded no test-set score" in card.text


def test_a_card_of_a_run_that_averaged_weight_snapshots_says_so(run_dir, tmp_path):
    from vaswani_mt.publishing.model_card import render_model_card

    def snapshots(metrics):
        metrics["selection"]["averaged_checkpoints"] = ["step-4200", "step-4300"]

    run = with_metrics(run_dir, tmp_path / "snapshots", snapshots)
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["training"].update(average_every=100, average_last=2)
    (run / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    text = render_model_card(run, REPO)
    assert "the average of the last 2 weight snapshots (step-4200, step-4300), as in §6.1" in text
    assert "| Checkpoint averaging | the last 2 weight snapshots, taken every 100 updates, kept if better" in text


def test_the_card_names_the_gpu_a_run_trained_on_and_a_validation_subset(run_dir, tmp_path):
    from vaswani_mt.publishing.model_card import render_model_card

    def on_gpu(metrics):
        metrics["training"]["hardware"].update(cuda=True, gpu="NVIDIA H100 80GB HBM3", cpu_count=16)

    run = with_metrics(run_dir, tmp_path / "gpu", on_gpu)
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["data"]["valid_subset"] = 500
    (run / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    text = render_model_card(run, REPO)
    assert "| Hardware | AMD EPYC 9R45, 16 cores; 2 torch threads; NVIDIA H100 80GB HBM3; torch 2.13.0+cpu |" in text
    assert ", beam 4, on the first 500 validation pairs |" in text


def test_what_the_card_says_about_the_data_comes_from_the_runs_data_description(run_dir, tmp_path):
    from huggingface_hub import ModelCard

    from vaswani_mt.publishing.model_card import render_model_card

    def with_description(name: str, description: dict) -> Path:
        copy_dir = tmp_path / name / run_dir.name
        shutil.copytree(run_dir, copy_dir)
        config = yaml.safe_load((copy_dir / "config.yaml").read_text())
        config["data"]["description"] = description
        (copy_dir / "config.yaml").write_text(yaml.safe_dump(config))
        return copy_dir

    bare = ModelCard(render_model_card(with_description("none", {}), REPO))  # a multi30k path alone says nothing
    assert bare.data.license_name == "training-data-terms" and bare.data.datasets == ["multi30k"]
    assert "does not know the terms of the training data (multi30k)" in bare.text
    assert "Multi30k" not in bare.text and "elliott" not in bare.text and "The training data:" not in bare.text

    mine = ModelCard(render_model_card(with_description("mine", {
        "name": "Tiny Corpus", "hub_id": "me/tiny", "license_name": "tiny-terms", "license_link": "https://x.org/t",
        "terms": "Use it kindly.", "domain": "Tiny sentences only.", "citation": "@misc{tiny}"}), REPO))
    assert mine.data.license_name == "tiny-terms" and mine.data.license_link == "https://x.org/t"
    assert mine.data.datasets == ["me/tiny"] and mine.data.eval_results[0].dataset_name == "Tiny Corpus"
    for text in ("on Tiny Corpus test2016", "\n- Tiny sentences only.\n",
                 "bound by its terms. Use it kindly. See https://x.org/t.",
                 "The training data:\n\n```bibtex\n@misc{tiny}\n```"):
        assert text in mine.text


def test_card_licence_follows_the_flag_and_the_template_ships_inside_the_package(run_dir):
    from importlib import resources

    from huggingface_hub import ModelCard, ModelCardData

    from vaswani_mt.publishing.model_card import TEMPLATE_NAME, card_from_template, render_model_card

    data = ModelCard(render_model_card(run_dir, REPO, license="cc-by-nc-4.0")).data.to_dict()
    assert data["license"] == "cc-by-nc-4.0" and "license_name" not in data
    assert resources.files("vaswani_mt.publishing").joinpath(TEMPLATE_NAME).is_file()
    with pytest.raises(KeyError, match="unknown key 'nope'"):
        card_from_template(ModelCardData(), "{{ nope }}")


def test_private_push_to_a_bare_name_goes_to_the_users_namespace_and_hides_the_repo(hub, cli_runs):
    from urllib.error import HTTPError
    from urllib.request import urlopen

    run = cli_runs["private push"]

    assert run["code"] == 0, run["stderr"]
    assert run["stdout"].strip().endswith(f"to {hub.url}/alice/private-model")
    repo = read_state(hub.storage)["repos"]["model/alice/private-model"]
    assert repo["private"]
    card = repo_files(hub.storage, "alice/private-model")["README.md"].decode()
    assert 'from_pretrained("alice/private-model", trust_remote_code=True)' in card  # the full id, not the bare name
    with pytest.raises(HTTPError) as anonymous:
        urlopen(f"{hub.url}/alice/private-model/resolve/main/config.json", timeout=10)
    assert anonymous.value.code == 401


@pytest.mark.slow
def test_a_real_training_run_folder_pushes_and_loads(hub, tmp_path):
    """End to end from `vaswani-mt train` (a tiny run on a few Multi30k-like lines) to a stock from_pretrained."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    from tiny_tokenizer import SENTENCES

    english, german = SENTENCES[:6], SENTENCES[6:] + SENTENCES[6:]
    for split, count in (("train", 6), ("valid", 3), ("test2016", 3)):
        (corpus / f"{split}.en").write_text("\n".join(english[:count]) + "\n")
        (corpus / f"{split}.de").write_text("\n".join(german[:count]) + "\n")
    config = copy.deepcopy(RUN_CONFIG)
    config["data"].update(path=str(corpus), max_length=64)
    config["tokenizer"] = {"vocab_size": 400}
    config["model"] = {"preset": "tiny", "config": {"max_position_embeddings": 128}}
    config["training"] = {"max_tokens": 512, "max_steps": 4, "warmup_steps": 2, "eval_steps": 2, "logging_steps": 1,
                          "keep_checkpoints": 2, "average_last": 2, "num_beams": 1, "seed": 3, "num_threads": 1}
    config["output_dir"] = str(tmp_path / "run")
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    train = subprocess.run([sys.executable, "-m", "vaswani_mt.cli", "train", "--config", str(tmp_path / "config.yaml")],
                           capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, cwd=REPO_ROOT,
                           timeout=CLIENT_TIMEOUT)
    assert train.returncode == 0, train.stderr[-3000:]

    result = push_cli(hub, tmp_path, tmp_path / "run", "alice/real-run")
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    card = repo_files(hub.storage, "alice/real-run")["README.md"].decode()
    assert f"| Updates | {metrics['training']['steps']} |" in card
    script = WITHOUT_VASWANI_MT + card_code(card, "translator = pipeline(") + "\nprint('{\"ok\": true}')\n"
    assert run_script(script, client_env(hub, tmp_path / "hf-user"), tmp_path) == {"ok": True}


def test_a_push_keeps_the_runs_own_pipeline_file_and_a_new_save_brings_the_current_one(tmp_path):
    import json

    from vaswani_mt.model.pipeline_vaswani import PIPELINE_FILE, custom_pipelines_entry, pipeline_code_changes

    (tmp_path / "config.json").write_text(json.dumps({"custom_pipelines": custom_pipelines_entry()}))
    (tmp_path / PIPELINE_FILE).write_text("# the pipeline this model was saved with\n")
    assert pipeline_code_changes(tmp_path) == {}
    assert list(pipeline_code_changes(tmp_path, keep_existing=False)) == [PIPELINE_FILE]


def test_a_card_writes_a_whole_epoch_limit_without_a_decimal_point():
    from vaswani_mt.publishing.model_card import _recipe_rows

    rows = dict(_recipe_rows({"num_epochs": 1000.0, "max_minutes": 85}))
    assert rows["Length"] == "at most 1,000 epochs and 85 minutes"
    assert dict(_recipe_rows({"num_epochs": 2.5}))["Length"] == "at most 2.5 epochs"


def seed_sibling(run_dir: Path, folder: Path, seed: int, bleu: float, **training) -> Path:
    """A copy of `run_dir` as another seed of its recipe (or, with `training` changes, of another recipe)."""
    shutil.copytree(run_dir, folder)
    config = yaml.safe_load((folder / "config.yaml").read_text())
    config["training"].update(seed=seed, **training)
    config["output_dir"] = f"runs/{folder.name}"
    (folder / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    metrics = json.loads((folder / "metrics.json").read_text())
    metrics["test"]["bleu"] = bleu
    metrics["training"]["steps"] = 4371 + seed
    (folder / "metrics.json").write_text(json.dumps(metrics))
    return folder


def test_a_card_with_its_seed_runs_gives_each_runs_test_bleu_and_the_recipes_mean_and_spread(run_dir, tmp_path):
    from vaswani_mt.publishing.model_card import render_model_card

    seeds = [seed_sibling(run_dir, tmp_path / f"seed{seed}", seed, bleu) for seed, bleu in ((2, 34.9), (3, 36.1))]
    text = render_model_card(run_dir, REPO, seed_runs=seeds)
    assert ("One run is not a recipe's result: this is one of 3 runs of the same recipe with different seeds, whose "
            "mean is BLEU 35.47 (34.90–36.10, sd 0.60, 3 runs): see Seeds.") in text
    assert "| run | seed | machine | updates | minutes | test BLEU |" in text
    assert "| `multi30k-en-de` | 1 | AMD EPYC 9R45 | 4,371 | 84.9 | 35.41 |" in text  # this run first
    assert "| `seed3` | 3 | AMD EPYC 9R45 | 4,374 | 84.9 | 36.10 |" in text
    assert "Test BLEU over the runs: 35.47 (34.90–36.10, sd 0.60, 3 runs)." in text
    # the metadata keeps this model's own scores: the mean is the recipe's, not these weights'
    assert "value: 35.41234" in text and "35.47078" not in text
    assert "## Seeds" not in render_model_card(run_dir, REPO)


def test_push_refuses_a_seed_run_of_another_recipe_or_an_unfinished_one_in_one_line_naming_it(run_dir, tmp_path,
                                                                                                capsys):
    from vaswani_mt.cli import main

    other = seed_sibling(run_dir, tmp_path / "other", 2, 34.9, warmup_steps=4000)
    assert main(["push", str(run_dir), REPO, "--dry-run", "--seed-runs", str(other)]) == 2
    assert capsys.readouterr().err == (
        f"vaswani-mt push: error: --seed-runs {other}: not a seed of this run's recipe: its config differs at "
        f"training.warmup_steps (seeds of one recipe differ only in training.seed, output_dir, data.path, "
        f"data.cache_dir, data.workers, training.num_threads)\n")
    (tmp_path / "unfinished").mkdir()
    assert main(["push", str(run_dir), REPO, "--seed-runs", str(tmp_path / "unfinished")]) == 2
    assert capsys.readouterr().err == (f"vaswani-mt push: error: --seed-runs {tmp_path / 'unfinished'}: no "
                                       f"metrics.json (not a finished run of `vaswani-mt train`)\n")
    assert main(["push", str(run_dir), REPO, "--dry-run", "--seed-runs", str(run_dir)]) == 2
    assert capsys.readouterr().err == f"vaswani-mt push: error: --seed-runs {run_dir}: given twice (as {run_dir} too)\n"
    again = seed_sibling(run_dir, tmp_path / "again", 1, 36.0)  # another folder, the same seed
    assert main(["push", str(run_dir), REPO, "--dry-run", "--seed-runs", str(again)]) == 2
    assert capsys.readouterr().err == (f"vaswani-mt push: error: --seed-runs {again}: training.seed 1 again (the seed "
                                       f"of {run_dir}): give runs with different seeds\n")
    unreadable = seed_sibling(run_dir, tmp_path / "unreadable", 3, 36.0)
    (unreadable / "config.yaml").write_text("[not, a, mapping]\n")
    assert main(["push", str(run_dir), REPO, "--dry-run", "--seed-runs", str(unreadable)]) == 2
    assert capsys.readouterr().err == (f"vaswani-mt push: error: --seed-runs {unreadable / 'config.yaml'}: missing or "
                                       f"not a YAML mapping (the run's resolved config)\n")


def test_the_seeds_of_a_run_on_lowercased_tokenized_text_are_scored_by_its_lc_tok_bleu(run_dir, tmp_path):
    from vaswani_mt.publishing.model_card import render_model_card

    def lctok(metrics):
        metrics["test"]["preprocess"] = "lowercase_moses"

    run = with_metrics(run_dir, tmp_path / "lctok", lctok)
    sibling = seed_sibling(run, tmp_path / "lctok2", 2, 35.0)  # its lc-tok BLEU stays 36.87311, as this run's
    text = render_model_card(run, REPO, seed_runs=[sibling])
    assert "| run | seed | machine | updates | minutes | test lowercased tokenized BLEU |" in text
    assert "Test lowercased tokenized BLEU over the runs: 36.87 (36.87–36.87, sd 0.00, 2 runs)." in text


def test_a_card_names_the_cooldown_beside_the_noam_schedule_only_when_the_run_had_one():
    from vaswani_mt.publishing.model_card import _recipe_rows

    training = {"warmup_steps": 800, "noam_factor": 0.64, "max_steps": 9000, "cooldown_steps": 2000}
    assert dict(_recipe_rows(training, updates=9000))["Learning rate"].endswith(
        "800 warm-up steps, factor 0.64 (§5.3); then a linear fall to 0 over updates 7,001-9,000 (not in the paper)")
    assert dict(_recipe_rows(training, updates=8500))["Learning rate"].endswith(
        "(not in the paper), but the run stopped at update 8,500")
    assert "fall" not in dict(_recipe_rows({**training, "cooldown_steps": None}))["Learning rate"]


# --- g. `push --demo`: the web demo's app.py for a Space -------------------------------------------------------------

DEMO_REPO = "alice/vaswani-tiny-demo"
OPEN_IN_THE_DEMO = textwrap.dedent("""
    import json, sys
    from vaswani_mt.inference.demo import load_demo_model, translate_nbest
    model, tokenizer = load_demo_model(sys.argv[1], "cpu")
    print(json.dumps([[h.token_ids, h.score] for h in translate_nbest(model, tokenizer, sys.argv[2],
                                                                     num_beams=2)[0].hypotheses]))
""")


def test_push_demo_adds_app_py_and_requirements_and_the_demo_opens_the_model_by_its_hub_id(hub, pushed, tmp_path):
    from vaswani_mt.inference.demo import translate_nbest
    from vaswani_mt.publishing.hub import demo_files

    requirement = "vaswani-mt[demo] @ git+https://example.org/vaswani_mt"
    result = push_cli(hub, tmp_path, pushed.run_dir, DEMO_REPO, "--demo", "--demo-requirement", requirement)
    assert result.returncode == 0, result.stderr[-4000:]

    files = repo_files(hub.storage, DEMO_REPO)
    assert set(files) == MODEL_FILES | {"README.md", ".gitattributes", "app.py", "requirements.txt"}
    assert files["app.py"] == demo_files(DEMO_REPO)["app.py"]
    assert f'else "{DEMO_REPO}")' in files["app.py"].decode("utf-8")
    assert files["requirements.txt"].decode("utf-8").splitlines()[-1] == requirement
    opened = run_script(OPEN_IN_THE_DEMO, client_env(hub, tmp_path / "hf"), tmp_path, DEMO_REPO, SOURCES[0])
    expected = translate_nbest(pushed.model, pushed.tokenizer, SOURCES[0], num_beams=2)[0].hypotheses
    assert [ids for ids, _ in opened] == [h.token_ids for h in expected]
    assert [score for _, score in opened] == pytest.approx([h.score for h in expected], abs=1e-5)


def test_a_dry_run_with_demo_lists_app_py_and_a_demo_requirement_needs_demo(run_dir, capsys):
    from vaswani_mt.cli import main

    assert main(["push", str(run_dir), REPO, "--dry-run", "--demo"]) == 0
    files = capsys.readouterr().err.strip().splitlines()[-2]
    assert files == "files: " + ", ".join(sorted(MODEL_FILES | {"README.md", "app.py", "requirements.txt"}))
    assert main(["push", str(run_dir), REPO, "--demo-requirement", "vaswani-mt[demo]"]) == 2
    assert capsys.readouterr().err == "vaswani-mt push: error: --demo-requirement goes with --demo\n"
