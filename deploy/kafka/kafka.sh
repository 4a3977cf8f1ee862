#!/usr/bin/env bash
# Run a real single-node Apache Kafka (KRaft) broker from Maven Central jars, without Docker.
#
#   kafka.sh fetch                                   resolve the broker jars into lib/ (once)
#   kafka.sh start [--dir RUNDIR] [--port P] [--controller-port C] [--timeout S]
#   kafka.sh stop  [--dir RUNDIR] [--timeout S]
#   kafka.sh status [--dir RUNDIR]
#
# `start` prints the bootstrap address (host:port) on stdout and nothing else, so
# `BOOTSTRAP=$(kafka.sh start)` works. Diagnostics go to stderr. RUNDIR (default
# $STREAM_DP_KAFKA_DIR, else ${XDG_STATE_HOME:-~/.local/state}/stream-dp/kafka: outside the work
# tree, since the broker's data holds records) receives server.properties, the data directory,
# server.log, kafka.out, kafka.pid and bootstrap. Starting again on an existing RUNDIR reuses its
# ports, cluster id and data, which is how tests simulate a broker outage and recovery.
#
# Environment: JAVA (java binary), PYTHON (interpreter with kafka-python, used for the
# readiness check), KAFKA_HEAP_OPTS (default "-Xms256m -Xmx512m"), KAFKA_JVM_OPTS (extra flags),
# MVN (maven binary), STREAM_DP_KAFKA_DIR (default RUNDIR), KAFKA_START_TIMEOUT (seconds `start`
# waits for readiness unless --timeout; default 90).
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
LIB_DIR="$SCRIPT_DIR/lib"
TEMPLATE="$SCRIPT_DIR/server.properties.template"
LOG4J_CONFIG="$SCRIPT_DIR/log4j2.properties"
DEFAULT_RUNDIR="${STREAM_DP_KAFKA_DIR:-${XDG_STATE_HOME:-$HOME/.local/state}/stream-dp/kafka}"
PYTHON="${PYTHON:-python3}"
MVN="${MVN:-mvn}"
HEAP_OPTS="${KAFKA_HEAP_OPTS:--Xms256m -Xmx512m}"
START_TIMEOUT="${KAFKA_START_TIMEOUT:-90}"
STOP_TIMEOUT=30

die() {
    echo "kafka.sh: error: $*" >&2
    exit 1
}

note() {
    echo "kafka.sh: $*" >&2
}

usage() {
    sed -n '2,8p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
}

java_bin() {
    if [[ -n "${JAVA:-}" ]]; then
        echo "$JAVA"
    elif [[ -n "${JAVA_HOME:-}" && -x "$JAVA_HOME/bin/java" ]]; then
        echo "$JAVA_HOME/bin/java"
    else
        echo java
    fi
}

check_java() {
    local java version major
    java="$(java_bin)"
    command -v "$java" >/dev/null 2>&1 || die "java not found (set JAVA or JAVA_HOME); Kafka 4 needs Java 17+"
    version="$("$java" -version 2>&1 | sed -n 's/.*version "\([^"]*\)".*/\1/p' | head -n1)"
    major="${version%%.*}"
    if [[ "$major" =~ ^[0-9]+$ ]] && ((major < 17)); then
        die "Kafka 4 needs Java 17 or newer, found '$version' ($java)"
    fi
}

pom_kafka_version() {
    sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$SCRIPT_DIR/pom.xml" | head -n1
}

lib_populated() {
    local version
    version="$(pom_kafka_version)"
    [[ -f "$LIB_DIR/kafka_2.13-$version.jar" ]] &&
        compgen -G "$LIB_DIR/log4j-core-*.jar" >/dev/null &&
        compgen -G "$LIB_DIR/log4j-slf4j-impl-*.jar" >/dev/null
}

cmd_fetch() {
    if lib_populated; then
        note "lib/ already holds Kafka $(pom_kafka_version); nothing to fetch"
        return 0
    fi
    # The test workers each start a broker: on a fresh checkout they all reach this point at
    # once, and two Mavens copying into lib/ (one emptying it first) fail each other. One
    # fetches; the others wait for it and find lib/ populated. Without flock (macOS), as before.
    if command -v flock >/dev/null 2>&1; then
        mkdir -p "$LIB_DIR"
        (
            flock 9
            fetch_unlocked
        ) 9>"$LIB_DIR/.fetch.lock"
    else
        fetch_unlocked
    fi
}

fetch_unlocked() {
    if lib_populated; then
        note "lib/ was populated meanwhile (Kafka $(pom_kafka_version)); nothing to fetch"
        return 0
    fi
    command -v "$MVN" >/dev/null 2>&1 || die "maven ('$MVN') not found; install Maven 3.8+ or set MVN"
    # A stale lib/ from another Kafka version would put two broker versions on the classpath.
    if [[ -d "$LIB_DIR" ]]; then
        rm -f "$LIB_DIR"/*.jar
    fi
    note "fetching Kafka $(pom_kafka_version) jars from Maven Central into $LIB_DIR"
    # Maven writes (colour-reset) bytes to stdout even with -q -B; stdout is reserved for the
    # bootstrap address that `start` prints, so everything Maven says goes to stderr.
    (cd "$SCRIPT_DIR" && "$MVN" -q -B -Dstyle.color=never dependency:copy-dependencies >&2) ||
        die "maven could not resolve the broker jars (is Maven Central reachable?)"
    lib_populated || die "maven finished but $LIB_DIR lacks the expected jars"
}

# --- run-directory helpers ------------------------------------------------------------------

parse_common() {
    CREATE_RUNDIR="${CREATE_RUNDIR:-0}"
    RUNDIR="$DEFAULT_RUNDIR"
    PORT=""
    CONTROLLER_PORT=""
    TIMEOUT=""
    while (($#)); do
        case "$1" in
        --dir)
            [[ $# -ge 2 ]] || die "--dir needs a value"
            RUNDIR="$2"
            shift 2
            ;;
        --port)
            [[ $# -ge 2 ]] || die "--port needs a value"
            PORT="$2"
            shift 2
            ;;
        --controller-port)
            [[ $# -ge 2 ]] || die "--controller-port needs a value"
            CONTROLLER_PORT="$2"
            shift 2
            ;;
        --timeout)
            [[ $# -ge 2 ]] || die "--timeout needs a value"
            TIMEOUT="$2"
            shift 2
            ;;
        -h | --help)
            usage
            exit 0
            ;;
        *) die "unknown argument '$1' (try --help)" ;;
        esac
    done
    for value in "$PORT" "$CONTROLLER_PORT" "$TIMEOUT"; do
        [[ -z "$value" || "$value" =~ ^[0-9]+$ ]] || die "expected a positive integer, got '$value'"
    done
    # Only `start` may create the run directory; stop/status on a typo'd path should not.
    if [[ "$CREATE_RUNDIR" == 1 ]]; then
        mkdir -p "$RUNDIR" && chmod 700 "$RUNDIR" # the broker's data holds the records
    fi
    RUNDIR_EXISTS=0
    if [[ -d "$RUNDIR" ]]; then
        RUNDIR_EXISTS=1
        RUNDIR="$(cd "$RUNDIR" && pwd)"
    fi
    PID_FILE="$RUNDIR/kafka.pid"
    BOOTSTRAP_FILE="$RUNDIR/bootstrap"
    PROPS="$RUNDIR/server.properties"
    LOG_FILE="$RUNDIR/server.log"
    OUT_FILE="$RUNDIR/kafka.out"
    DATA_DIR="$RUNDIR/data"
}

prop() {
    sed -n "s/^$1=//p" "$PROPS" | head -n1
}

# True if process $1 exists and is not a zombie. A broker reparented to a pid 1 that never
# reaps would otherwise look alive forever after it exited.
pid_alive() {
    local state
    state="$(sed -n 's/^State:[[:space:]]*\([A-Z]\).*/\1/p' "/proc/$1/status" 2>/dev/null || true)"
    [[ -n "$state" && "$state" != Z && "$state" != X ]]
}

# Prints the broker pid if the pid file names a live broker of *this* RUNDIR. Checking the
# command line guards against a recycled pid belonging to something else.
running_pid() {
    local pid
    [[ -f "$PID_FILE" ]] || return 1
    pid="$(cat "$PID_FILE" 2>/dev/null || true)"
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    pid_alive "$pid" || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF "$PROPS" || return 1
    echo "$pid"
}

free_ports() {
    # Bind both sockets at once so the two picks cannot collide with each other.
    "$PYTHON" - <<'EOF'
import socket
socks = []
for _ in range(2):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
for s in socks:
    s.close()
EOF
}

port_is_free() {
    # SO_REUSEADDR mirrors the JVM's server sockets, so TIME_WAIT leftovers of a broker we just
    # stopped do not count as "in use".
    "$PYTHON" - "$1" <<'EOF'
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    s.bind(("127.0.0.1", int(sys.argv[1])))
except OSError:
    sys.exit(1)
finally:
    s.close()
EOF
}

admin_ready() {
    "$PYTHON" - "$1" <<'EOF' >/dev/null 2>&1
import sys
from kafka import KafkaAdminClient
admin = KafkaAdminClient(bootstrap_servers=sys.argv[1], request_timeout_ms=5000,
                         client_id="kafka.sh-readiness")
try:
    admin.list_topics()
finally:
    admin.close()
EOF
}

show_logs() {
    local f
    for f in "$OUT_FILE" "$LOG_FILE"; do
        if [[ -s "$f" ]]; then
            echo "---- last lines of $f ----" >&2
            tail -n 25 "$f" >&2
        fi
    done
}

write_config() {
    local picked p1 p2
    if [[ -z "$PORT" || -z "$CONTROLLER_PORT" ]]; then
        picked="$(free_ports)" || die "could not pick free loopback ports (is $PYTHON working?)"
        read -r p1 p2 <<<"$picked"
        if [[ -z "$PORT" ]]; then
            PORT="$p1"
            [[ -n "$CONTROLLER_PORT" ]] || CONTROLLER_PORT="$p2"
        else
            CONTROLLER_PORT="$p1"
            [[ "$CONTROLLER_PORT" != "$PORT" ]] || CONTROLLER_PORT="$p2"
        fi
    fi
    [[ "$PORT" != "$CONTROLLER_PORT" ]] || die "broker and controller ports must differ ($PORT)"
    [[ -f "$TEMPLATE" ]] || die "missing template $TEMPLATE"
    sed -e "s|@PORT@|$PORT|g" -e "s|@CONTROLLER_PORT@|$CONTROLLER_PORT|g" \
        -e "s|@LOG_DIR@|$DATA_DIR|g" "$TEMPLATE" >"$PROPS.tmp"
    mv "$PROPS.tmp" "$PROPS"
}

format_storage() {
    local java cluster_id
    java="$(java_bin)"
    if [[ -f "$DATA_DIR/meta.properties" ]]; then
        return 0
    fi
    if [[ ! -s "$RUNDIR/cluster.id" ]]; then
        "$java" -cp "$LIB_DIR/*" -Dlog4j2.configurationFile="$LOG4J_CONFIG" \
            -Dkafka.logs.dir="$RUNDIR" kafka.tools.StorageTool random-uuid \
            >"$RUNDIR/cluster.id.tmp" 2>>"$OUT_FILE" || die "StorageTool random-uuid failed (see $OUT_FILE)"
        mv "$RUNDIR/cluster.id.tmp" "$RUNDIR/cluster.id"
    fi
    cluster_id="$(tr -d '[:space:]' <"$RUNDIR/cluster.id")"
    "$java" -cp "$LIB_DIR/*" -Dlog4j2.configurationFile="$LOG4J_CONFIG" \
        -Dkafka.logs.dir="$RUNDIR" kafka.tools.StorageTool format -t "$cluster_id" -c "$PROPS" \
        --ignore-formatted >>"$OUT_FILE" 2>&1 || {
        show_logs
        die "formatting the storage in $DATA_DIR failed"
    }
}

cmd_start() {
    CREATE_RUNDIR=1 parse_common "$@"
    local timeout="${TIMEOUT:-$START_TIMEOUT}" pid existing_port java log_offset deadline
    check_java
    command -v "$PYTHON" >/dev/null 2>&1 || die "python ('$PYTHON') not found; set PYTHON"
    "$PYTHON" -c 'import kafka' 2>/dev/null ||
        die "$PYTHON cannot import kafka-python (needed for the readiness check); pip install kafka-python"
    lib_populated || cmd_fetch >&2

    if [[ -f "$PROPS" ]]; then
        existing_port="$(prop listeners | sed -n 's/.*PLAINTEXT:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p')"
        if [[ -n "$PORT" && "$PORT" != "$existing_port" ]]; then
            die "$RUNDIR is already set up for port $existing_port; use another --dir or drop --port"
        fi
        PORT="$existing_port"
        CONTROLLER_PORT="$(prop controller.quorum.voters | sed 's/.*://')"
    fi

    if pid="$(running_pid)"; then
        note "broker already running (pid $pid) in $RUNDIR"
        cat "$BOOTSTRAP_FILE"
        return 0
    fi
    rm -f "$PID_FILE"

    if [[ ! -f "$PROPS" ]]; then
        if [[ -n "$PORT" ]] && ! port_is_free "$PORT"; then
            die "port $PORT on 127.0.0.1 is already in use"
        fi
        write_config
    fi
    for p in "$PORT" "$CONTROLLER_PORT"; do
        port_is_free "$p" || die "port $p on 127.0.0.1 is in use (another broker on this RUNDIR's ports?)"
    done
    format_storage

    java="$(java_bin)"
    log_offset=0
    [[ -f "$LOG_FILE" ]] && log_offset="$(stat -c %s "$LOG_FILE")"
    echo "127.0.0.1:$PORT" >"$BOOTSTRAP_FILE"
    # setsid: the broker must not receive the caller's Ctrl-C (tests stop it cleanly at teardown)
    # and must not keep the caller's stdout/stderr pipes open.
    local launcher=()
    command -v setsid >/dev/null 2>&1 && launcher=(setsid)
    # shellcheck disable=SC2086  # HEAP_OPTS/KAFKA_JVM_OPTS are deliberately word-split
    "${launcher[@]}" "$java" $HEAP_OPTS ${KAFKA_JVM_OPTS:-} -Djava.awt.headless=true \
        -Dlog4j2.configurationFile="$LOG4J_CONFIG" -Dkafka.logs.dir="$RUNDIR" \
        -cp "$LIB_DIR/*" kafka.Kafka "$PROPS" </dev/null >>"$OUT_FILE" 2>&1 &
    pid=$!
    echo "$pid" >"$PID_FILE"

    deadline=$((SECONDS + timeout))
    local started=0
    while ((SECONDS < deadline)); do
        if ! pid_alive "$pid"; then
            show_logs
            rm -f "$PID_FILE"
            die "the broker process exited during start-up (logs above; RUNDIR $RUNDIR)"
        fi
        if ((started == 0)) && tail -c +"$((log_offset + 1))" "$LOG_FILE" 2>/dev/null |
            grep -q "Kafka Server started"; then
            started=1
        fi
        if ((started == 1)) && admin_ready "127.0.0.1:$PORT"; then
            note "broker ready (pid $pid) after $((SECONDS - deadline + timeout)) s in $RUNDIR"
            echo "127.0.0.1:$PORT"
            return 0
        fi
        sleep 0.5
    done
    show_logs
    note "the broker did not become ready within $timeout s; stopping it"
    stop_pid "$pid" "$STOP_TIMEOUT" || true
    rm -f "$PID_FILE"
    die "broker start timed out after $timeout s (RUNDIR $RUNDIR)"
}

# Waits until $1 is gone (or a zombie). Returns 1 if it is still alive after $2 seconds.
wait_gone() {
    local pid="$1" deadline=$((SECONDS + $2))
    while ((SECONDS < deadline)); do
        pid_alive "$pid" || return 0
        sleep 0.2
    done
    return 1
}

stop_pid() {
    local pid="$1" timeout="$2"
    kill -TERM "$pid" 2>/dev/null || return 0
    if wait_gone "$pid" "$timeout"; then
        return 0
    fi
    note "broker (pid $pid) ignored SIGTERM for $timeout s; sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    wait_gone "$pid" 10 || die "broker (pid $pid) survived SIGKILL"
}

cmd_stop() {
    parse_common "$@"
    local pid timeout="${TIMEOUT:-$STOP_TIMEOUT}"
    if [[ "$RUNDIR_EXISTS" == 0 ]]; then
        note "no run directory $RUNDIR; nothing to stop"
        return 0
    fi
    if ! pid="$(running_pid)"; then
        note "no broker running in $RUNDIR"
        rm -f "$PID_FILE"
        return 0
    fi
    stop_pid "$pid" "$timeout"
    rm -f "$PID_FILE"
    note "broker (pid $pid) stopped"
}

cmd_status() {
    parse_common "$@"
    local pid
    if pid="$(running_pid)"; then
        echo "running pid=$pid bootstrap=$(cat "$BOOTSTRAP_FILE" 2>/dev/null) dir=$RUNDIR"
        return 0
    fi
    echo "stopped dir=$RUNDIR"
    # LSB convention: 3 means "not running".
    return 3
}

main() {
    local cmd="${1:-}"
    [[ $# -gt 0 ]] && shift
    case "$cmd" in
    fetch) cmd_fetch "$@" ;;
    start) cmd_start "$@" ;;
    stop) cmd_stop "$@" ;;
    status) cmd_status "$@" ;;
    -h | --help | help)
        usage
        ;;
    "")
        usage
        exit 2
        ;;
    *)
        usage
        die "unknown subcommand '$cmd'"
        ;;
    esac
}

main "$@"
