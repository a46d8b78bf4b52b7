"""`vaswani-mt push`: upload a trained run to the Hugging Face Hub with its model card.

    vaswani-mt push RUN_DIR REPO_ID [--private] [--token T] [--license ID] [--dataset ID] [--demo] [--dry-run]

What is uploaded, in one commit: the files of ``RUN_DIR/model/`` (weights, config.json with ``auto_map`` and
``custom_pipelines``, generation config, tokenizer, ``modeling_vaswani.py``, ``configuration_vaswani.py``,
``pipeline_vaswani.py``) and ``README.md``, the card rendered from the run (:mod:`vaswani_mt.publishing.model_card`).
Nothing else of the run folder (no checkpoints, logs or optimizer states). With ``--demo``, also ``app.py`` and
``requirements.txt``: the page of ``vaswani-mt demo`` for a Space (:func:`demo_files`); without it, neither.
Afterwards, with stock transformers and without vaswani_mt::

    AutoModelForSeq2SeqLM.from_pretrained(REPO_ID, trust_remote_code=True)
    pipeline("translation", model=REPO_ID, trust_remote_code=True)

Checks before anything is sent: the run folder is complete (model weights, config, model code, tokenizer,
metrics.json, config.yaml), a token exists (``--token``, ``HF_TOKEN`` or ``hf auth login``), the Hub accepts it, and
its user may write to the repo's namespace. Errors print one line and exit with 2 (bad input: incomplete run folder,
bad repo id) or 1 (authentication, permission, network).

The endpoint is huggingface_hub's (``HF_ENDPOINT``, default https://huggingface.co).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from ..files import TOKENIZER_FILES, first_line
from ..model.pipeline_vaswani import pipeline_code_changes
from ..run_record import RunFolder
from .model_card import render_model_card
from .seeds import SeedRunError, recipe_runs

MODEL_DIR = RunFolder(".").model.name
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
CODE_FILES = ("modeling_vaswani.py", "configuration_vaswani.py")
LOGIN_HINT = ("log in with `hf auth login`, or set the HF_TOKEN environment variable, to a token with write access "
              "(https://huggingface.co/settings/tokens); or pass --token")


class PushError(Exception):
    """A push that cannot go ahead; the message says why and what to do. `exit_code`: 2 for bad input, 1 for the
    Hub refusing (authentication, permissions) or being unreachable."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


# --- checks that need no network ------------------------------------------------------------------------------------

def check_seed_runs(run_dir, folders) -> None:
    """`PushError` (exit code 2) when one of `folders` is not a finished run of `run_dir`'s recipe with another seed
    (`publishing.seeds.recipe_runs`)."""
    if folders:
        try:
            recipe_runs(run_dir, folders)
        except SeedRunError as error:
            raise PushError(f"--seed-runs {error}", 2) from None


def check_run_folder(run_dir) -> Path:
    """The run's model folder, or `PushError` (exit code 2) naming everything that is missing."""
    run = RunFolder(run_dir)
    if not run.root.is_dir():
        raise PushError(f"{run_dir} is not a folder: give the run folder written by `vaswani-mt train`", 2)
    model_dir = run.model
    missing = []
    if not model_dir.is_dir():
        missing.append(f"{MODEL_DIR}/ (the trained model)")
    else:
        if not any((model_dir / name).is_file() for name in WEIGHT_FILES):
            missing.append(f"{MODEL_DIR}/model.safetensors (the model weights)")
        config_path = model_dir / "config.json"
        if not config_path.is_file():
            missing.append(f"{MODEL_DIR}/config.json (the model config)")
        else:
            try:
                auto_map = json.loads(config_path.read_text(encoding="utf-8")).get("auto_map") or {}
            except ValueError:
                auto_map = None
            if auto_map is None:
                missing.append(f"{MODEL_DIR}/config.json is not valid JSON")
            elif not {"AutoConfig", "AutoModelForSeq2SeqLM"} <= set(auto_map):
                missing.append(f"an auto_map in {MODEL_DIR}/config.json (so stock transformers finds the model code)")
        for name in CODE_FILES:
            if not (model_dir / name).is_file():
                missing.append(f"{MODEL_DIR}/{name} (the model code)")
        modeling = model_dir / CODE_FILES[0]
        if modeling.is_file():  # and the modules it imports (older checkpoints: generation_vaswani.py)
            for module in re.findall(r"^from \.(\w+) import", modeling.read_text(encoding="utf-8"), re.M):
                if not (model_dir / f"{module}.py").is_file():
                    missing.append(f"{MODEL_DIR}/{module}.py (imported by the model code)")
        if not any((model_dir / name).is_file() for name in TOKENIZER_FILES):
            missing.append(f"{MODEL_DIR}/tokenizer.json (the tokenizer)")
    for path, what in ((run.record, "the run's scores, for the model card"),
                       (run.config, "the run's configuration, for the model card")):
        if not path.is_file():
            missing.append(f"{path.name} ({what})")
    if missing:
        raise PushError(f"{run_dir} is not a complete run folder: missing " + "; ".join(missing)
                        + ". Push the folder of a finished `vaswani-mt train` run.", 2)
    return model_dir


def split_repo_id(repo_id: str) -> tuple[str | None, str]:
    """``"user/name"`` -> ``("user", "name")``; ``"name"`` -> ``(None, "name")``; `PushError` (exit code 2) for an
    invalid id."""
    parts = repo_id.split("/")
    pattern = r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}"
    if len(parts) > 2 or not all(re.fullmatch(pattern, part) and ".." not in part and "--" not in part
                                 for part in parts):
        raise PushError(f"invalid repo id {repo_id!r}: use <user or organization>/<model name>, with letters, digits, "
                        "'-', '_' and '.'", 2)
    return (parts[0], parts[1]) if len(parts) == 2 else (None, parts[0])


# --- the demo for a Space (`push --demo`) ----------------------------------------------------------------------------

DEMO_REQUIREMENT = "vaswani-mt[demo]"
DEMO_APP = '''"""The web demo of the translation model {repo_id}: `vaswani-mt demo`'s page (translations, the beam's
n-best list with scores, attention heatmaps), uploaded by `vaswani-mt push --demo`.

On a Hugging Face Space (SDK: Gradio), with this file and requirements.txt in the Space, or here: `python app.py`.
The model is the VASWANI_MT_MODEL environment variable (a folder or a Hub id) when set; else this file's folder when
it holds a model (a clone of the model repo); else {repo_id}.
"""

import os
from pathlib import Path

from vaswani_mt.inference.demo_app import app_for

HERE = Path(__file__).resolve().parent
MODEL = os.environ.get("VASWANI_MT_MODEL") or (str(HERE) if (HERE / "config.json").is_file() else {repo_literal})

demo = app_for(MODEL)

if __name__ == "__main__":
    demo.launch()
'''


def demo_files(repo_id: str, requirement: str | None = None) -> dict[str, bytes]:
    """``app.py`` (the page of `vaswani-mt demo` for the model `repo_id`) and its ``requirements.txt``, whose
    package line is `requirement` (default ``vaswani-mt[demo]``; vaswani-mt is not on PyPI, so a Space needs where
    pip gets it, such as ``vaswani-mt[demo] @ git+https://...``)."""
    requirement = (requirement or DEMO_REQUIREMENT).strip()
    if not requirement or "\n" in requirement:
        raise PushError(f"--demo-requirement must be one requirement line, got {requirement!r}", 2)
    requirements = ("# The packages of app.py: vaswani-mt with its demo extra (gradio, matplotlib). vaswani-mt is not\n"
                    "# on PyPI: `vaswani-mt push --demo-requirement SPEC` names where pip gets it.\n"
                    f"{requirement}\n")
    app = DEMO_APP.format(repo_id=repo_id, repo_literal=json.dumps(repo_id))
    return {"app.py": app.encode("utf-8"),
            "requirements.txt": requirements.encode("utf-8")}


def upload_plan(model_dir: Path) -> list[tuple[str, Path]]:
    """``(path in repo, local file)`` for every file of the model folder that goes up (top-level files only; a README
    there is replaced by the card)."""
    return [(path.name, path) for path in sorted(model_dir.iterdir())
            if path.is_file() and not path.name.startswith(".") and path.name != "README.md"
            and not path.name.endswith((".tmp", ".lock"))]




# --- the push -------------------------------------------------------------------------------------------------------

def push_run(run_dir, repo_id: str, private: bool = False, token: str | None = None,
             commit_message: str = "Upload vaswani_mt model and model card", *,
             license: str | None = None,  # noqa: A002 - the Hub's name for it
             license_name: str | None = None, license_link: str | None = None, dataset: str | None = None,
             demo: bool = False, demo_requirement: str | None = None, seed_runs=()) -> str:
    """Upload a run folder's model and its model card to `repo_id` (created if needed, `private` then) in one commit;
    returns the repo's URL. With `demo`, also the web demo's ``app.py`` and ``requirements.txt``
    (:func:`demo_files`). `seed_runs`: run folders of the same recipe with other seeds, for the card's mean and
    spread. Raises `PushError` with a one-line reason when the folder is incomplete, a seed run is not one, there is
    no usable token, the namespace belongs to someone else, or the Hub refuses or cannot be reached."""
    model_dir = check_run_folder(run_dir)
    check_seed_runs(run_dir, seed_runs)
    namespace, name = split_repo_id(repo_id)
    if demo:
        demo_files(repo_id, demo_requirement)  # a bad requirement is refused before any request
    plan = upload_plan(model_dir)
    replacements = pipeline_code_changes(model_dir)

    from huggingface_hub import CommitOperationAdd, HfApi, constants, get_token

    endpoint = constants.ENDPOINT
    token = token or get_token()
    if not token:
        raise PushError(f"no Hugging Face token found: {LOGIN_HINT}")
    api = HfApi(token=token)
    user = _whoami(api, endpoint)
    namespace = namespace or user["name"]
    _check_namespace(user, namespace, f"{namespace}/{name}")
    full_id = f"{namespace}/{name}"
    card = render_model_card(run_dir, full_id, license=license, license_name=license_name, license_link=license_link,
                             dataset=dataset, seed_runs=seed_runs)

    operations = [CommitOperationAdd(path_in_repo=path, path_or_fileobj=str(local)) for path, local in plan
                  if path not in replacements]
    operations += [CommitOperationAdd(path_in_repo=path, path_or_fileobj=data) for path, data in replacements.items()]
    if demo:
        operations += [CommitOperationAdd(path_in_repo=path, path_or_fileobj=data)
                       for path, data in demo_files(full_id, demo_requirement).items()]
    operations.append(CommitOperationAdd(path_in_repo="README.md", path_or_fileobj=card.encode("utf-8")))
    with _hub_errors(full_id, endpoint):
        url = api.create_repo(full_id, private=private, exist_ok=True)
        api.create_commit(full_id, operations=operations, commit_message=commit_message)
    return str(url)


def _whoami(api, endpoint: str) -> dict:
    from huggingface_hub.errors import HfHubHTTPError

    try:
        return api.whoami()
    except HfHubHTTPError as error:
        status = getattr(error.response, "status_code", None)
        if status == 401:
            raise PushError(f"the Hub at {endpoint} rejected the token (invalid or expired): {LOGIN_HINT}") from None
        raise PushError(f"could not check the token with the Hub at {endpoint}: {first_line(error)}") from None
    except Exception as error:
        if _is_network_error(error):
            raise PushError(f"cannot reach the Hub at {endpoint}: {first_line(error)}") from None
        raise


def _check_namespace(user: dict, namespace: str, repo_id: str) -> None:
    name = user.get("name")
    role = ((user.get("auth") or {}).get("accessToken") or {}).get("role")
    if role == "read":
        raise PushError(f"the token of {name!r} is read-only, so it cannot push to {repo_id}: create a token with "
                        "write access (https://huggingface.co/settings/tokens) and log in again with "
                        "`hf auth login` or set HF_TOKEN")
    if namespace == name:
        return
    orgs = {org.get("name"): org.get("roleInOrg") for org in user.get("orgs") or []}
    if namespace not in orgs:
        names = ", ".join(sorted(o for o in orgs if o)) or "none"
        raise PushError(f"cannot push to {repo_id}: the namespace {namespace!r} belongs to someone else (the token "
                        f"belongs to {name!r}, organizations: {names}); push to {name}/{repo_id.split('/')[1]} "
                        f"instead, or log in with a token of a member of {namespace!r}")
    if orgs[namespace] not in (None, "admin", "write", "contributor"):
        raise PushError(f"cannot push to {repo_id}: {name!r} has only the {orgs[namespace]!r} role in the "
                        f"organization {namespace!r}; ask an admin of {namespace!r} for write access")


class _hub_errors:
    """Turn huggingface_hub / network exceptions into `PushError`s with one clear line."""

    def __init__(self, repo_id: str, endpoint: str):
        self.repo_id, self.endpoint = repo_id, endpoint

    def __enter__(self):
        return self

    def __exit__(self, kind, error, traceback):
        if error is None or isinstance(error, PushError):
            return False
        from huggingface_hub.errors import HfHubHTTPError

        if isinstance(error, HfHubHTTPError):
            status = getattr(error.response, "status_code", None)
            server = _server_message(error)
            if status == 401:
                raise PushError(f"the Hub at {self.endpoint} refused the token: {LOGIN_HINT}") from None
            if status == 403:
                raise PushError(f"cannot push to {self.repo_id}: the Hub refused write access (403"
                                + (f": {server}" if server else "") + "). The repo or its namespace belongs to "
                                "someone else, or the token lacks write permission.") from None
            raise PushError(f"the Hub refused the upload to {self.repo_id} (HTTP {status}"
                            + (f": {server}" if server else f": {first_line(error)}") + ")") from None
        if _is_network_error(error):
            raise PushError(f"cannot reach the Hub at {self.endpoint}: {first_line(error)}") from None
        if isinstance(error, ValueError):  # e.g. huggingface_hub's "Invalid metadata in README.md"
            raise PushError(f"the upload to {self.repo_id} failed: {first_line(error)}") from None
        return False


def _is_network_error(error: BaseException) -> bool:
    """Whether `error` means the Hub could not be reached: an OSError, or an error of huggingface_hub's HTTP client
    (httpx, httpx2, httpcore or requests, none of which derive from OSError)."""
    return isinstance(error, OSError) or type(error).__module__.startswith(("httpx", "httpcore", "requests"))


def _server_message(error) -> str | None:
    response = getattr(error, "response", None)
    if response is None:
        return None
    message = response.headers.get("X-Error-Message")
    if not message:
        try:
            message = (response.json() or {}).get("error")
        except Exception:  # not JSON
            message = None
    return message if isinstance(message, str) else None



__all__ = ["PushError", "push_run", "check_run_folder", "demo_files", "split_repo_id", "upload_plan"]
