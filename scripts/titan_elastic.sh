#!/usr/bin/env bash
# The launch experiment through TorchTitan's own Trainer: checkpoint at step 150 on 16 ranks, resume on 8, 32
# and 64, every global batch compared (SHA-256) with the uninterrupted run's. Uses the machine's GPUs (NCCL);
# a run needing more ranks than GPUs runs them as CPU processes over gloo (simulated ranks).
#
# Usage:  bash scripts/titan_elastic.sh --dataset-path data/web,data/code --hf-assets-path assets/tokenizer \
#             [--config zephon_llama3_1b] [--seq-len 2048] [--out titan-elastic-out] [--dry-run] [-- torchtitan args]
# --dry-run plans the runs, parses each with TorchTitan's ConfigManager and builds rank 0's loader at every
# dp degree, then stops (tests/test_titan_elastic_script.py runs it on CPU). All options:
#   bash scripts/titan_elastic.sh --help       (benchmarks/titan/elastic.py)
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python}"
export PYTHONPATH="$REPO:$REPO/adapters${PYTHONPATH:+:$PYTHONPATH}"
cd "$REPO"
exec "$PYTHON" -m benchmarks.titan.elastic "$@"
