#!/bin/sh
# memcheck_serve.sh - build/ikbo-serve under compute-sanitizer memcheck, as a
# drop-in daemon binary for the integration tests (put it as ikbo-serve in an
# IKBO_BUILD directory; bench/e2e/device.sh faults-memcheck does).
#
# Why this exists: the tests stop the daemon with SIGTERM and require exit 0,
# but compute-sanitizer does not forward signals to the program it runs, so
# it would die of the signal before writing its summary. This forwards
# SIGTERM/SIGINT to the daemon and exits with compute-sanitizer's status:
# the daemon's, or 86 when memcheck found an error.
# env: IKBO_REAL_SERVE (the daemon binary), IKBO_MEMCHECK_LOG (log path;
# %p is the pid).
compute-sanitizer --tool memcheck --error-exitcode 86 --log-file "$IKBO_MEMCHECK_LOG" \
    "$IKBO_REAL_SERVE" "$@" &
cs=$!
trap 'pkill -TERM -P $cs' TERM
trap 'pkill -INT -P $cs' INT
while :; do
    wait $cs
    rc=$?
    kill -0 $cs 2>/dev/null || break
done
exit $rc
