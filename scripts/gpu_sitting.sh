#!/usr/bin/env bash
# One GPU sitting (issue 65), one command of at most 8 minutes: `cli.py doctor`'s default stages (the gpu tests,
# Table 2 at 8k/32k/16k/2k, the 360M compiled step per variant, the profile of SA's parts; 460 s of budgets, each
# stage keeping what it measured if cut), every file packed under $OUT. On the lent GPU (the device tool's run):
#   bash scripts/gpu_sitting.sh                  # run with timeout_s 560 and carry [".whl"]
#   bash scripts/gpu_sitting.sh --budget train=240 --stages train   # any doctor arguments, to rerun a part
#   bash scripts/gpu_sitting.sh --stages env seeds decide   # the ensembles' sitting (issue 64), 460 s
# Its CPU dry run, under a minute, is in the test suite: python cli.py doctor --tiny (tests/test_doctor.py).
set -u
OUT=${OUT:-outputs/gpu_sitting}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TQDM_DISABLE=1
if [ -d .whl ]; then  # the packages the device's image lacks, carried as wheels
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 cli.py doctor --out outputs/doctor --overwrite "$@" 2>&1 | tee "$OUT/doctor.log"
cp outputs/doctor/report.md outputs/doctor/report.json "$OUT/" 2>/dev/null
tar czf "$OUT/doctor.tgz" --exclude="outputs/doctor/*/runs" outputs/doctor  # the cells, not the runs' logs and checkpoints
echo "sitting done at ${SECONDS} s"
