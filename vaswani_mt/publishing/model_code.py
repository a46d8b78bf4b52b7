"""The code beside a saved model, brought up to date: `vaswani-mt upgrade`.

A folder saved by `save_pretrained` (a run's model/, each checkpoint, an average, a download of a Hub repo) carries
the model code it was saved with, and stock transformers runs that copy with `trust_remote_code=True`. Code saved
before vaswani_mt took the cache under both of its names decodes wrongly on transformers 5.24 and newer (each step
after the first without its history). Replacing the code files with the installed package's repairs such a folder:
the weights, config and tokenizer stay as they are.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..files import write_atomically
from ..model import configuration_vaswani, modeling_vaswani, pipeline_vaswani

# the files that travel with a model, from the installed package (pipeline_vaswani.py only where a folder has it)
CODE_MODULES = {"configuration_vaswani.py": configuration_vaswani, "modeling_vaswani.py": modeling_vaswani,
                "pipeline_vaswani.py": pipeline_vaswani}
# code that earlier versions saved and that nothing imports any more (the fast loops now stay in the package)
RETIRED_FILES = ("generation_vaswani.py",)


@dataclass
class CodeChanges:
    """What `upgrade` does (or did) to one model folder."""

    folder: Path
    replaced: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)

    @property
    def current(self) -> bool:
        return not self.replaced and not self.removed

    def describe(self) -> str:
        if self.current:
            return f"{self.folder}: code already current"
        parts = ([f"replaced {', '.join(self.replaced)}"] if self.replaced else []) + (
            [f"removed {', '.join(self.removed)}"] if self.removed else [])
        return f"{self.folder}: {'; '.join(parts)}"


def model_folders(path: str | os.PathLike) -> list[Path]:
    """The vaswani model folders at or under `path` (a model folder, a run folder with model/, checkpoints/ and
    averages, or any folder of them): those with a config.json of model_type "vaswani". ValueError naming the problem
    when there is none."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"{path} does not exist")
    if not path.is_dir():
        raise ValueError(f"{path} is not a folder: give a model folder or a run folder")
    folders = sorted(config.parent for config in path.rglob("config.json") if _is_vaswani_config(config))
    if not folders:
        raise ValueError(f"{path} holds no vaswani model folder (a config.json with model_type 'vaswani')")
    return folders


def _is_vaswani_config(config: Path) -> bool:
    try:
        model_type = json.loads(config.read_text(encoding="utf-8")).get("model_type")
        return model_type == configuration_vaswani.VaswaniConfig.model_type
    except (OSError, ValueError, AttributeError):
        return False


def code_changes(folder: Path) -> CodeChanges:
    """What upgrading `folder` would change."""
    changes = CodeChanges(folder)
    for name, module in CODE_MODULES.items():
        target = folder / name
        if name == "pipeline_vaswani.py" and not target.is_file():
            continue
        if not target.is_file() or target.read_bytes() != Path(module.__file__).read_bytes():
            changes.replaced.append(name)
    changes.removed = [name for name in RETIRED_FILES if (folder / name).is_file()]
    return changes


def upgrade(folder: Path, dry_run: bool = False) -> CodeChanges:
    """Replace `folder`'s model code with the installed package's, each file atomically; the model code first, so a
    folder interrupted half-way still loads (the new modeling file imports only the configuration)."""
    changes = code_changes(folder)
    if not dry_run:
        for name in sorted(changes.replaced, key=lambda n: n != "modeling_vaswani.py"):
            write_atomically(Path(CODE_MODULES[name].__file__).read_bytes(), folder / name)
        for name in changes.removed:
            (folder / name).unlink()
    return changes


__all__ = ["CODE_MODULES", "RETIRED_FILES", "CodeChanges", "code_changes", "model_folders", "upgrade"]
