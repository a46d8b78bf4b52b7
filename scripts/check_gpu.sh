#!/usr/bin/env bash
# The checks of one CUDA machine, in about 10 minutes: the default test suite with the GPU visible, the paper's base
# shape's training speed (bf16, eager and compiled), two processes on one GPU (gloo: two torchrun nodes of one process
# each on 127.0.0.1), also with a worker killed, and data preparation on 1, 4, 8 and 16 workers. Each check has a time limit; its log goes to
# OUT_DIR/<check>.log and one line per check to OUT_DIR/summary.txt. Needs Multi30k in ../shared/data/multi30k.
#
#   bash scripts/check_gpu.sh OUT_DIR [PAIRS]     # PAIRS: the generated corpus for the preparation check (150000)
set -u
OUT=${1:?usage: check_gpu.sh OUT_DIR [PAIRS]}
PAIRS=${2:-150000}
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"

check() {  # check NAME SECONDS COMMAND...: run COMMAND with a time limit, log it, record how it ended
  local name=$1 limit=$2 started=$SECONDS
  shift 2
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local status=$?
  echo "$name: exit $status after $((SECONDS - started)) s (limit $limit s)" | tee -a "$SUMMARY"
}

{
  nvidia-smi -L
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
  lscpu | grep -E "^Model name|^CPU\(s\)"
} > "$OUT/machine.txt" 2>&1

# 1. The paper's base shape: one training step of ~25k target tokens, bf16 autocast, eager and torch.compile.
check base-shape-speed 120 python3 scripts/bench_gpu.py --skip-decoding --shapes base --precisions bf16 --compile \
  --reps 3 --steps 10

# 2. Two processes on the one GPU: two torchrun nodes of one process each (each on cuda:0; NCCL refuses two ranks
#    on one GPU, gloo does not), 40 updates of a tiny run, one run folder.
WORK=$(mktemp -d)
python3 - "$WORK" <<'EOF'
import sys
from pathlib import Path
import yaml
work = Path(sys.argv[1]); corpus = work / "corpus"; corpus.mkdir()
multi30k = Path("../shared/data/multi30k")
for split, source, count in (("train", "train", 300), ("valid", "valid", 16)):
    for lang in ("en", "de"):
        lines = (multi30k / f"{source}.{lang}").read_text(encoding="utf-8").splitlines()[:count]
        (corpus / f"{split}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
(work / "run.yaml").write_text(yaml.safe_dump({
    "data": {"path": str(corpus), "test_split": None, "max_length": 64, "cache_dir": str(work / "cache")},
    "tokenizer": {"vocab_size": 400}, "model": {"preset": "tiny", "config": {"max_position_embeddings": 128}},
    "training": {"max_tokens": 512, "max_steps": 40, "warmup_steps": 4, "eval_steps": 10, "logging_steps": 10,
                 "keep_checkpoints": 5, "average_last": 2, "num_beams": 1, "seed": 3, "ddp_backend": "gloo"},
}))
EOF
cat > "$WORK/two_nodes.sh" <<'SCRIPT'
# the tiny run as two torchrun nodes of one process each on this machine's GPU; prints what its record says
set -e
port=$(python3 -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
pids=()
for rank in 0 1; do
  python3 -m torch.distributed.run --nnodes 2 --nproc_per_node 1 --node_rank $rank --master_addr 127.0.0.1 \
    --master_port "$port" -m vaswani_mt.cli.train --config "$1/run.yaml" --output_dir "$1/two-nodes" &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done
python3 -c "import json, sys; t = json.load(open(sys.argv[1]))['training']; \
print('world size', t['world_size'], 'updates', t['steps'], 'precision', t.get('precision'))" "$1/two-nodes/metrics.json"
SCRIPT
check two-processes-one-gpu 80 bash "$WORK/two_nodes.sh" "$WORK"

# 2b. The same two nodes, elastic (c10d rendezvous, --max-restarts 1, --resume): rank 1 dies while the checkpoint of
#     update 30 is written (tests/trainer_helpers/die_in_save.py); the run should restart and end at update 40.
cat > "$WORK/killed_worker.sh" <<'SCRIPT'
set -e
port=$(python3 -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
pids=()
for rank in 0 1; do
  python3 -m torch.distributed.run --nnodes 2 --nproc_per_node 1 --rdzv-backend c10d --rdzv-endpoint \
    "127.0.0.1:$port" --rdzv-id killed-worker --max-restarts 1 tests/trainer_helpers/die_in_save.py 1 30 -- \
    --config "$1/run.yaml" --output_dir "$1/killed-worker" --resume &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done
grep -E "removing|resuming from" "$1/killed-worker/train.log"
python3 -c "import json, sys; t = json.load(open(sys.argv[1]))['training']; \
print('world size', t['world_size'], 'updates', t['steps'])" "$1/killed-worker/metrics.json"
SCRIPT
check killed-worker-one-gpu 60 bash "$WORK/killed_worker.sh" "$WORK"

# 3. Preparation on 1, 4, 8 and 16 workers of a generated corpus (Multi30k pairs joined at random).
check data-workers 150 python3 scripts/bench_data_prep.py --pairs "$PAIRS" --sample 100000 --workers 1 4 8 16 \
  --work "$WORK/prep"

# 4. The default suite with CUDA visible, on 8 worker processes where pytest-xdist is installed, with what time is left.
parallel=()
python3 -c "import xdist" 2> /dev/null && parallel=(-n 8)
check test-suite-cuda 130 python3 -m pytest -q -p no:cacheprovider "${parallel[@]}" -m "not slow and not browser" tests
rm -rf "$WORK"
