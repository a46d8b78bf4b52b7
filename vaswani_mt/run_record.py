"""One training run's facts, in one typed place: the run-folder layout and everything a run produces.

`vaswani-mt train` fills a `RunRecord` as it goes and writes it once, at the end, as the run folder's
``metrics.json`` (its presence marks a finished run); the model card and `vaswani-mt push` only read it
(`RunRecord.read`); `VaswaniTrainer`'s Hub pushes build one from the trainer (`RunRecord.from_trainer`).

A leaf module: it imports nothing from the package but `vaswani_mt.files` and `vaswani_mt.typed` (leaves too), so
every layer may use it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .files import write_atomically
from .typed import from_mapping


@dataclass(frozen=True)
class RunFolder:
    """Where `vaswani-mt train` puts each thing of a run (the folder given as ``output_dir``)."""

    root: Path

    def __init__(self, root: str | os.PathLike):
        object.__setattr__(self, "root", Path(root))

    config = property(lambda self: self.root / "config.yaml")  # the resolved run config
    record = property(lambda self: self.root / "metrics.json")  # the RunRecord; written last: the run is finished
    model = property(lambda self: self.root / "model")  # the final model + tokenizer + model code
    checkpoints = property(lambda self: self.root / "checkpoints")  # the Trainer's checkpoint-<step> folders
    tokenizer = property(lambda self: self.root / "tokenizer")  # the joint BPE the run trained
    averaged = property(lambda self: self.root / "averaged")  # the average of the last checkpoints (§6.1)
    snapshots = property(lambda self: self.root / "snapshots")  # weights every training.average_every updates
    plots = property(lambda self: self.root / "plots")  # learning rate, losses, BLEU over the updates
    log = property(lambda self: self.root / "train.log")  # everything the run printed
    log_history = property(lambda self: self.root / "log_history.json")  # the Trainer's log, one entry per log
    test_hypotheses = property(lambda self: self.root / "test.hyp")  # the test split's translations
    data_revision = property(lambda self: self.root / "data_revision.json")  # the Hub dataset commit it reads

    @property
    def name(self) -> str:
        return self.root.resolve().name


@dataclass
class Hardware:
    """The machine a run trained on (every speed figure is printed beside it)."""

    cpu: str | None = None
    cpu_count: int | None = None
    torch_threads: int | None = None
    cuda: bool | None = None
    gpu: str | None = None
    torch: str | None = None

    @classmethod
    def of_this_machine(cls) -> Hardware:
        import torch

        cpu = platform.processor() or platform.machine()
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
        except OSError:
            pass
        cuda = torch.cuda.is_available()
        return cls(cpu=cpu, cpu_count=os.cpu_count(), torch_threads=torch.get_num_threads(), cuda=cuda,
                   gpu=torch.cuda.get_device_name() if cuda else None, torch=torch.__version__)


@dataclass
class TimeBudgetPlan:
    """How `training.budget_minutes` laid the run out on its machine (vaswani_mt.recipe.budget)."""

    budget_minutes: float | None = None
    updates: int | None = None  # the planned last update (the last plan's)
    fall_from: int | None = None  # the update after which the rate first fell, to 0 at `updates` (None: no cool-down)
    cooldown_from: int | None = None  # older records, instead of `fall_from`: a start of the fall (`fall_start`)
    warmup_steps: int | None = None  # the warm-up's updates (at most a quarter of the plan's)
    test_sentences: int | None = None  # the test sentences translated, where the budget cut the split (None: all)
    seconds_per_update: float | None = None  # the pace the last plan measured
    seconds_per_validation: float | None = None  # a validation pass and its checkpoint
    plans: list[dict] = field(default_factory=list)  # each plan logged: step, updates, cooldown_from, pace, why
    resumed: bool | None = None  # resumed from a checkpoint, keeping its plan
    run_minutes: float | None = None  # from the budget's start (the command's) to the run's record

    def fall_start(self) -> int | None:
        """Where the rate first fell: `fall_from`, as the schedule knew it (`NoamLR.fall_start`). A record without it
        (older) is read from its plans: a plan made once the fall had begun re-laid the rest of it, which still began
        where it began. Only plans that moved the run by more than `recipe.budget.RELOG` are logged, so that is where
        the last plan logged before the fall laid it. Without plans, `cooldown_from`."""
        if self.fall_from is not None:
            return self.fall_from
        if not self.plans:
            return self.cooldown_from
        start = None
        for plan in self.plans:
            if start is None or start >= plan["step"]:  # the fall not yet begun: this plan lays it
                start = plan["cooldown_from"]
        return start


@dataclass
class TrainingFigures:
    """How training went: updates, time, throughput, the last loss."""

    steps: int | None = None
    epochs: float | None = None
    wall_seconds_this_process: float | None = None
    train_runtime_seconds: float | None = None
    target_tokens_per_second_median: float | None = None  # median over the logging intervals
    final_train_loss: float | None = None  # label-smoothed, per target token
    world_size: int | None = None
    # batches each process accumulated per update (at the end: a resume on another number of processes changes it)
    gradient_accumulation_steps: int | None = None
    hardware: Hardware | None = None
    precision: str | None = None  # "bfloat16 autocast (training.precision is auto: ...)", "float32 (...)": what, why
    skipped_updates: int | None = None  # updates float16 loss scaling skipped (gradients overflowed); None: no scaling
    time_budget: TimeBudgetPlan | None = None  # the plan of a run with training.budget_minutes

    @classmethod
    def from_trainer_state(cls, state, world_size: int | None, **figures) -> TrainingFigures:
        """The figures a `TrainerState` holds (its log history), plus `figures` measured outside it."""
        history = state.log_history or []
        rates = sorted(entry["target_tokens_per_second"] for entry in history if "target_tokens_per_second" in entry)
        skipped = [entry["skipped_updates"] for entry in history if "skipped_updates" in entry]
        values = dict(steps=state.global_step, epochs=round(state.epoch or 0, 2),
                      train_runtime_seconds=_last(history, "train_runtime"),
                      target_tokens_per_second_median=rates[len(rates) // 2] if rates else None,
                      final_train_loss=_last(history, "loss"), world_size=world_size,
                      skipped_updates=sum(skipped) if skipped else None)
        return cls(**{**values, **figures})


@dataclass
class ModelFacts:
    preset: str | None = None
    parameters: int | None = None
    config: dict = field(default_factory=dict)  # the model config's differences from the defaults


@dataclass
class Selection:
    """Which weights the final model holds (§6.1: the average of the last checkpoints if it is better on valid)."""

    chosen: str | None = None  # "best_checkpoint" or "averaged"
    best_checkpoint: str | None = None
    valid_bleu_best_checkpoint: float | None = None
    averaged_checkpoints: list[str] | None = None
    valid_bleu_averaged: float | None = None


@dataclass
class Validation:
    """The last evaluation during training."""

    step: int | None = None
    bleu: float | None = None
    chrf: float | None = None
    signatures: dict | None = None


@dataclass
class TestScores:
    """The final model on the test split, with sacreBLEU's signatures."""

    __test__ = False  # a name pytest would otherwise collect

    split: str | None = None
    sentences: int | None = None
    bleu: float | None = None
    bleu_signature: str | None = None
    chrf: float | None = None
    chrf_signature: str | None = None
    bleu_lowercased_moses_tokenized: float | None = None
    bleu_lowercased_moses_tokenized_signature: str | None = None
    num_beams: int | None = None
    seconds: float | None = None
    preprocess: str | None = None  # the text both sides were scored on, e.g. "lowercase_moses"; None: raw text


@dataclass
class RunRecord:
    """Everything one run produced. ``metrics.json`` holds all of it but the three fields read from elsewhere: the
    run config (``config.yaml``) and the saved model's ``config.json`` / ``generation_config.json``."""

    name: str | None = None  # the run folder's name
    command: str | None = None  # the command line that made the run
    training: TrainingFigures = field(default_factory=TrainingFigures)
    model: ModelFacts = field(default_factory=ModelFacts)
    data: dict[str, dict] = field(default_factory=dict)  # split -> cleaning counts (`CleaningReport.to_dict()`)
    data_revision: str | None = None  # the commit of the Hub dataset the run read (None: local files)
    selection: Selection | None = None
    validation: Validation | None = None
    test: TestScores | None = None
    bleu_signatures_during_training: dict | None = None
    # not in metrics.json:
    config: dict = field(default_factory=dict)  # the resolved run config, sections data/tokenizer/model/training
    model_config: dict = field(default_factory=dict)
    generation_config: dict = field(default_factory=dict)

    NOT_IN_METRICS = ("name", "config", "model_config", "generation_config")

    # -- the metrics.json file ------------------------------------------------------------------------------------
    def to_json(self) -> dict:
        """The metrics.json content; parts and scores the run did not produce are left out (figures of `training`
        and `model` stay, as null)."""
        out = {}
        for key, value in dataclasses.asdict(self).items():
            if key in self.NOT_IN_METRICS or value is None:
                continue
            if isinstance(value, dict) and key not in ("training", "model", "data"):
                value = {k: v for k, v in value.items() if v is not None}
            out[key] = value
        return out

    @classmethod
    def from_json(cls, values: dict) -> RunRecord:
        """The record of a metrics.json, written by this version or an earlier one (unknown keys are ignored)."""
        return from_mapping(cls, values, strict=False)

    def write(self, folder: RunFolder) -> None:
        """Write metrics.json (atomically: a run folder with one is finished)."""
        text = json.dumps(self.to_json(), indent=2, ensure_ascii=False) + "\n"
        write_atomically(text.encode(), folder.record)

    @classmethod
    def read(cls, run_dir: str | os.PathLike) -> RunRecord:
        """The record of a run folder; files that are missing or unreadable give empty parts."""
        folder = RunFolder(run_dir)
        record = cls.from_json(_read_json(folder.record))
        record.name = folder.name
        record.config = _read_yaml(folder.config)
        record.model_config = _read_json(folder.model / "config.json")
        record.generation_config = _read_json(folder.model / "generation_config.json")
        return record

    # -- a record of a Trainer, for its Hub pushes -----------------------------------------------------------------
    @classmethod
    def from_trainer(cls, trainer) -> RunRecord:
        """What a (Vaswani)Trainer knows now: its state and arguments, the model's config, and the record of the run
        folder around its output folder (``vaswani-mt train`` puts checkpoints in ``RUN/checkpoints``) when there is
        one. That record's test scores and selection count only when it was written at the trainer's current step."""
        model = trainer.accelerator.unwrap_model(trainer.model)
        args, state = trainer.args, trainer.state
        output_dir = Path(args.output_dir)
        run = next((cls.read(folder) for folder in (output_dir, output_dir.parent)
                    if RunFolder(folder).record.is_file() or RunFolder(folder).config.is_file()), cls())
        plan = getattr(trainer, "time_budget_facts", lambda: None)()
        training = TrainingFigures.from_trainer_state(
            state, args.world_size, hardware=Hardware.of_this_machine() if state.global_step else None,
            precision=run.training.precision or ("bfloat16 autocast" if args.bf16 else "float16 autocast with dynamic "
                                                 "loss scaling" if args.fp16 else "float32"),
            time_budget=from_mapping(TimeBudgetPlan, plan) if plan else run.training.time_budget)
        record = cls(
            name=output_dir.resolve().name, command=run.command, training=training,
            model=ModelFacts(preset=run.model.preset, parameters=model.num_parameters()), data=run.data,
            data_revision=run.data_revision,
            validation=last_validation(state.log_history or [], getattr(trainer, "bleu_signatures", None)),
            config=run.config or {"training": args.recipe_settings()},
            model_config=model.config.to_dict(),
            generation_config=model.generation_config.to_dict() if getattr(model, "generation_config", None) else {},
        )
        if run.training.steps == state.global_step:
            record.test, record.selection = run.test, run.selection
        return record


def last_validation(history: list[dict], signatures: dict | None = None) -> Validation | None:
    """The last evaluation in a Trainer's log history."""
    for entry in reversed(history):
        if "eval_bleu" in entry:
            return Validation(step=entry.get("step"), bleu=entry["eval_bleu"], chrf=entry.get("eval_chrf"),
                              signatures=signatures or None)
    return None


def _last(history: list[dict], key: str):
    return next((entry[key] for entry in reversed(history) if key in entry), None)


def _read_json(path: Path) -> dict:
    try:
        value = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _read_yaml(path: Path) -> dict:
    try:
        value = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return {}
    return value if isinstance(value, dict) else {}


__all__ = ["RunFolder", "RunRecord", "Hardware", "TimeBudgetPlan", "TrainingFigures", "ModelFacts", "Selection",
           "Validation", "TestScores", "last_validation"]
