# stage_lib.sh - the stage runner of the one-call GPU scripts,
# bench/e2e/device.sh and bench/kernels/run.sh (sourced, never run).
#
# Why this exists: both scripts run each check as a "stage" whose output goes
# to a log under $OUT and whose outcome is one row of the table printed last;
# each had its own copy of stage(), alike but for the table's column widths,
# so a change to one drifted from the other. (bench/e2e/stage.sh is another
# thing: it builds and gathers the binaries device.sh runs.)
# bench/kernels/ab_device.sh's check() is not this: it overwrites its log
# with no header, skips a check once its time budget is spent, keeps no
# time column and folds a failure into its exit status.
#
# State: reads OUT (the log folder), STAGE_NAME_WIDTH (the name column,
# default 10) and STAGE_TAIL_WIDTH (how much of the log's last line a row
# shows, default 100); appends to the caller's array `summary` (declare it
# before the first stage).

# Runs CMD with its output (stdout and stderr) appended to $OUT/LOG after a
# line "== NAME: CMD", then adds a row to summary: NAME, CMD's exit status,
# its seconds and the log's last line. Returns 0: the status is in the row.
stage() { # name log cmd...
  local name=$1 log=$2; shift 2
  local t0=$SECONDS
  echo "== $name: $*" >> "$OUT/$log"
  "$@" >> "$OUT/$log" 2>&1
  local rc=$?
  summary+=("$(printf "%-${STAGE_NAME_WIDTH:-10}s rc=%-3s %4ss  %s" "$name" "$rc" "$((SECONDS - t0))" \
      "$(tail -n 1 "$OUT/$log" | cut -c1-"${STAGE_TAIL_WIDTH:-100}")")")
}
