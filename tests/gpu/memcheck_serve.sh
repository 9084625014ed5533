#!/bin/sh
# memcheck_serve.sh - build/ikbo-serve under compute-sanitizer memcheck, as a
# drop-in daemon binary for the integration tests (put it as ikbo-serve in an
# IKBO_BUILD directory; bench/e2e/device.sh faults-memcheck does).
#
# Why this exists: the tests stop the daemon with SIGTERM and require exit 0,
# but compute-sanitizer does not forward signals to the program it runs (it
# died of the signal, without its summary). This passes SIGTERM/SIGINT on to
# the daemon - the descendant of compute-sanitizer running IKBO_REAL_SERVE -
# and exits with compute-sanitizer's status: the daemon's, or 86 when
# memcheck found an error.
# env: IKBO_REAL_SERVE (the daemon binary), IKBO_MEMCHECK_LOG (log path;
# %p is the pid).
compute-sanitizer --tool memcheck --error-exitcode 86 --log-file "$IKBO_MEMCHECK_LOG" \
    "$IKBO_REAL_SERVE" "$@" &
cs=$!
real=$(readlink -f "$IKBO_REAL_SERVE")

descendants() {
    for c in $(pgrep -P "$1"); do
        echo "$c"
        descendants "$c"
    done
}

forward() {
    for p in $(descendants $cs); do
        [ "$(readlink -f /proc/$p/exe 2>/dev/null)" = "$real" ] && kill -"$1" "$p"
    done
}

trap 'forward TERM' TERM
trap 'forward INT' INT
while :; do
    wait $cs
    rc=$?
    kill -0 $cs 2>/dev/null || break
done
exit $rc
