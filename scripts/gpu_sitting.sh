#!/usr/bin/env bash
# One GPU sitting (issue 65), one command of at most 8 minutes: `cli.py doctor`'s default stages (the gpu tests,
# Table 2 at 8k/32k/16k/2k, the 360M compiled step per variant, the profile of SA's parts; 460 s of budgets, each
# stage keeping what it measured if cut), every file packed under $OUT. On the lent GPU (the device tool's run):
#   bash scripts/gpu_sitting.sh                  # run with timeout_s 560 and carry [".whl"]
#   bash scripts/gpu_sitting.sh --budget train=240 --stages train   # any doctor arguments, to rerun a part
#   bash scripts/gpu_sitting.sh --stages env seeds decide   # the ensembles' sitting (issue 64), 460 s
# Its CPU dry run, under a minute, is in the test suite: python cli.py doctor --tiny (tests/test_doctor.py), and
# this script with --tiny (tests/test_cluster.py::test_a_sitting_fails_with_the_doctors_status_and_never_leaves_an_earlier_report).
# It exits with the doctor's status: 0 and "sitting done" only when every stage it ran is ok; otherwise its last
# line, on stderr, says "sitting failed: ..." and names the stages not ok (or that the doctor stopped before its
# first). $OUT never holds an earlier sitting's files: gpu.txt, doctor.log, report.md, report.json and doctor.tgz
# are removed before anything runs (nothing else there is touched), and the report and doctor.tgz come only from a
# report that this sitting's doctor wrote (the doctor folder's earlier report.md and report.json are removed first).
set -u
OUT=${OUT:-outputs/gpu_sitting}
DOCTOR=outputs/doctor  # the doctor's own folder (--overwrite): a stage's cells there are continued by a later sitting
CLI="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/cli.py"  # this checkout's, from any folder
fail() {  # fail STATUS SENTENCE: the sitting's last line, and its exit status
  echo "sitting failed: $2" >&2
  exit "$1"
}
mkdir -p "$OUT" || fail 1 "cannot make the output folder $OUT."
cleared=()
for name in gpu.txt doctor.log report.md report.json doctor.tgz; do
  if [ -e "$OUT/$name" ]; then cleared+=("$name"); fi
done
rm -f "$OUT/gpu.txt" "$OUT/doctor.log" "$OUT/report.md" "$OUT/report.json" "$OUT/doctor.tgz" \
  "$DOCTOR/report.md" "$DOCTOR/report.json" || fail 1 "cannot remove an earlier sitting's files from $OUT or $DOCTOR."
if [ ${#cleared[@]} -gt 0 ]; then
  echo "removed an earlier sitting's ${cleared[*]} from $OUT"
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TQDM_DISABLE=1
if [ -d .whl ]; then  # the packages the device's image lacks, carried as wheels
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || fail $? "installing the wheels in .whl (pip's message above); the doctor did not run."
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
if command -v nvidia-smi > /dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
else  # a CPU's dry run (--tiny)
  echo "no nvidia-smi on this machine" | tee "$OUT/gpu.txt"
fi
python3 "$CLI" doctor --out "$DOCTOR" --overwrite "$@" 2>&1 | tee "$OUT/doctor.log"
status=${PIPESTATUS[0]}
if [ -f "$DOCTOR/report.json" ]; then  # this sitting's (the earlier one was removed above)
  cp "$DOCTOR/report.md" "$DOCTOR/report.json" "$OUT/" || fail 1 "cannot copy the doctor's report into $OUT."
  # the cells, not the runs' logs and checkpoints
  tar czf "$OUT/doctor.tgz" --exclude="$DOCTOR/*/runs" "$DOCTOR" || fail 1 "cannot pack $DOCTOR into $OUT/doctor.tgz."
fi
if [ "$status" -ne 0 ]; then
  if [ -f "$OUT/report.json" ]; then
    stages=$(python3 -c 'import json, sys
stages = json.load(open(sys.argv[1]))["stages"]
print(", ".join("%s (%s)" % (n, r.get("status")) for n, r in stages.items() if r.get("status") not in ("ok", "skipped")))' \
      "$OUT/report.json" 2>/dev/null)
    fail "$status" "the doctor exited with $status; not ok: ${stages:-none in its report (see $OUT/doctor.log)}; this sitting's report is $OUT/report.md."
  fi
  fail "$status" "the doctor exited with $status before its first stage and wrote no report: $(grep -v '^\s*$' "$OUT/doctor.log" | tail -n 1)"
fi
if [ ! -f "$OUT/report.json" ]; then
  fail 1 "the doctor exited with 0 and wrote no report in $DOCTOR."
fi
echo "sitting done at ${SECONDS} s"
