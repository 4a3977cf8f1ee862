#!/bin/sh
# The container's entrypoint: `stream-dp ARGS`, with the restart decision compose cannot make.
#
# Compose's restart policies cannot tell exit codes apart: `unless-stopped` restarts an engine
# refused for a bad config (exit 2) or a refused state directory (3) every few seconds, for ever.
# So this script decides, by what a restart can fix:
#
#   exit 1 (unexpected), 4 (Kafka unreachable or past its outage deadline), killed by a signal:
#       exit with the code, and the restart policy starts the engine again (it resumes from its
#       checkpoint, exactly once);
#   exit 2 (configuration), 3 (state refused), 5 (fenced by another instance of the model), and
#   0 (a run that ends by itself, source.max_idle_seconds): a restart cannot fix these, so the
#       container stays up and idle ("parked"): no restart loop, the reason is the last lines of
#       `docker compose logs`, the health check says unhealthy, and after fixing the cause
#       `docker compose restart stream-dp` runs it again.
#
# SIGTERM and SIGINT (docker stop, Ctrl-C) go to the engine, which commits and exits; the
# script then exits with the engine's code. Any other command (produce, watch, merge, a --dry-run,
# --help) simply runs.
set -u

case " $* " in
*" --dry-run "* | *" --help "* | *" -h "*) exec stream-dp "$@" ;;
esac
if [ "${1:-}" != run ]; then
    exec stream-dp "$@"
fi

PARKED="${STREAM_DP_PARKED_FILE:-/tmp/stream-dp.parked}"
rm -f "$PARKED"
stopping=0
child=""

on_signal() {
    stopping=1
    if [ -n "$child" ]; then
        kill -TERM "$child" 2>/dev/null
    fi
}
trap on_signal TERM INT

stream-dp "$@" &
child=$!
if [ "$stopping" = 1 ]; then # a signal before $child was known
    kill -TERM "$child" 2>/dev/null
fi
rc=0
wait "$child" || rc=$?
# A trapped signal interrupts `wait`: wait again for the engine's own exit code.
while kill -0 "$child" 2>/dev/null; do
    rc=0
    wait "$child" || rc=$?
done
child=""
if [ "$stopping" = 1 ]; then
    exit "$rc"
fi

case "$rc" in
0) why="the run ended (source.max_idle_seconds)" ;;
2) why="configuration error" ;;
3) why="state directory refused" ;;
5) why="fenced: another instance of this model is running" ;;
*) exit "$rc" ;;
esac

echo "stream-dp exited with code $rc ($why): a restart cannot fix it, so the container stays" \
    "idle instead of restarting. Fix the cause, then: docker compose restart stream-dp" >&2
echo "$rc $why" >"$PARKED"
# A signal between `sleep &` and `wait` is not seen by that wait, so each sleep is short: a
# stop is noticed within PARK_POLL seconds at worst (docker stop waits 10 s).
PARK_POLL=2
while [ "$stopping" = 0 ]; do
    sleep "$PARK_POLL" &
    child=$!
    if [ "$stopping" = 0 ]; then
        wait "$child" 2>/dev/null
    fi
done
kill "$child" 2>/dev/null
exit "$rc"
