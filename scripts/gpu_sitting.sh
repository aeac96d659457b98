#!/usr/bin/env bash
# One sitting on a lent GPU (the device tool): the doctor, then a timed pilot of the long-range study's
# trained test on the same machine, each part's files packed under $OUT. Usage, on the GPU machine:
#   bash scripts/gpu_sitting.sh [SECONDS]     # SECONDS: the whole sitting (default 585)
#   bash scripts/gpu_sitting.sh profile       # a second call: where SA's time goes (bench profile, issue 50)
set -u
OUT=${OUT:-outputs/gpu_sitting}; mkdir -p "$OUT"
if [ "${1:-}" = profile ]; then  # about 3 minutes: one Table 2 layer at 8k and a 360M step per variant
  export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
  [ -d .whl ] && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
  nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/gpu.txt"
  timeout 400 python3 cli.py bench profile --preset paper --variants swa sa sa_swa sa_bucket random \
    --out "$OUT/profile" --overwrite 2>&1 | tee "$OUT/profile.log"
  exit 0
fi
LIMIT=${1:-585}
T0=$SECONDS
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TQDM_DISABLE=1
if [ -d .whl ]; then  # the packages the device's image lacks, carried as wheels
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
timeout $((LIMIT - 20)) python3 cli.py doctor --out outputs/doctor --overwrite 2>&1 | tee "$OUT/doctor.log"
tar czf "$OUT/doctor.tgz" outputs/doctor
LEFT=$((LIMIT - (SECONDS - T0) - 15))
echo "doctor done at $((SECONDS - T0)) s; ${LEFT} s left for the long-range pilot"
if [ "$LEFT" -gt 40 ]; then
  timeout "$LEFT" python3 cli.py study long-range --variants sa random --depths 2 --windows 16 \
    --seeds 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 --eval_samples 1 --jobs 8 --out outputs/gpu_pilot \
    --set trainer.accelerator=gpu --set trainer.max_steps=300 --set data.init_args.val_examples=256 \
    2>&1 | tee "$OUT/pilot.log"
  tar czf "$OUT/pilot.tgz" outputs/gpu_pilot --exclude='*.ckpt' --exclude='tb'
fi
echo "sitting done at $((SECONDS - T0)) s"
