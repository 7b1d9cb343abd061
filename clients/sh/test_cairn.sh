#!/bin/sh
# Tests for cairn.sh with a real FIFO, real worker processes and a real SIGTERM.
# Run with a POSIX sh (dash): sh clients/sh/test_cairn.sh; exits 1 if any check fails.
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/cairn.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
unset CAIRN_CHANNEL CAIRN_RESUME CAIRN_DEBUG

# check NAME EXPECTED ACTUAL
check() {
    if [ "$2" = "$3" ]; then
        echo "ok   $1"
    else
        printf 'FAIL %s\n--- expected:\n%s\n--- actual:\n%s\n---\n' "$1" "$2" "$3"
        failures=$((failures + 1))
    fi
}

# open_channel: a FIFO read by a background cat, as cairn reads it (held open for reading all
# along). This shell keeps a spare write end on fd 9, so a writer closing it is not an EOF.
open_channel() {
    rm -f "$tmp/channel" "$tmp/received"
    mkfifo "$tmp/channel"
    cat "$tmp/channel" > "$tmp/received" &
    reader=$!
    exec 9> "$tmp/channel"
}

# close_channel: wait for the reader to get everything; then it is in $tmp/received.
close_channel() {
    exec 9>&-
    wait "$reader"
}

# wait_for_line FILE LINE: poll (up to 120 s, generous for a busy machine) until FILE holds LINE.
wait_for_line() {
    n=0
    until grep -Fqx "$2" "$1" 2> /dev/null; do
        n=$((n + 1))
        [ "$n" -le 2400 ] || { echo "timed out waiting for '$2' in $1"; return 1; }
        sleep 0.05
    done
}

# --- each helper sends one exact line; bad numbers send nothing -------------------------------
open_channel
CAIRN_CHANNEL=$tmp/channel
cairn_checkpoint 7 '{"seen":["a b","c"],"s":"x\"y\\n"}'
cairn_progress 7 40
cairn_cost 0.12
cairn_output '{"answer":42}'
cairn_heartbeat
cairn_checkpoint 8 null
cairn_checkpoint x '{}' 2> "$tmp/err1"
s1=$?
cairn_progress 1 '' 2> "$tmp/err2"
s2=$?
cairn_cost '1;rm' 2> "$tmp/err3"
s3=$?
close_channel
check "messages" '{"checkpoint":{"iteration":7,"state":{"seen":["a b","c"],"s":"x\"y\\n"}}}
{"progress":{"done":7,"total":40}}
{"cost":0.12}
{"output":{"answer":42}}
{"heartbeat":true}
{"checkpoint":{"iteration":8,"state":null}}' "$(cat "$tmp/received")"
check "bad arguments fail with status 2" "2 2 2" "$s1 $s2 $s3"
check "bad arguments say why" "cairn: iteration must be a whole number, not 'x'
cairn: total must be a whole number, not ''
cairn_cost: not a number: '1;rm'" "$(cat "$tmp/err1" "$tmp/err2" "$tmp/err3")"
unset CAIRN_CHANNEL

# --- resume -----------------------------------------------------------------------------------
check "fresh start: iteration" 0 "$(cairn_resume_iteration)"
check "fresh start: state" null "$(cairn_resume_state)"
# Exactly what the daemon writes: one line, these keys in this order, compact JSON, a newline.
printf '%s\n' '{"iteration":12,"state":{"a":{"b":"}"},"state":[1,{}]}}' > "$tmp/resume.json"
CAIRN_RESUME=$tmp/resume.json
check "resume: iteration" 12 "$(cairn_resume_iteration)"
check "resume: state" '{"a":{"b":"}"},"state":[1,{}]}' "$(cairn_resume_state)"
printf '%s\n' '{"state":1,"iteration":2}' > "$tmp/resume.json"
check "resume: other layout is an error" "cairn: $tmp/resume.json is not a checkpoint of the form {\"iteration\":N,\"state\":...}
1" \
    "$(cairn_resume_iteration 2>&1; echo $?)"
CAIRN_RESUME=$tmp/missing.json
check "resume: missing file is an error" 1 "$(cairn_resume_state > /dev/null 2>&1 && echo 0 || echo 1)"
unset CAIRN_RESUME

# --- outside cairn: no-ops --------------------------------------------------------------------
all_helpers() {
    cairn_checkpoint 1 '[1]' && cairn_progress 1 2 && cairn_cost 3 && cairn_output '"x"' && cairn_heartbeat
}
check "no channel: silent" "0:" "$(all_helpers 2>&1; echo "$?:")"
check "no channel, CAIRN_DEBUG: stderr" 'cairn: {"checkpoint":{"iteration":1,"state":[1]}}
cairn: {"progress":{"done":1,"total":2}}
cairn: {"cost":3}
cairn: {"output":"x"}
cairn: {"heartbeat":true}
0' "$(CAIRN_DEBUG=1 all_helpers 2>&1 > /dev/null; echo $?)"

# --- SIGTERM ----------------------------------------------------------------------------------
# A worker whose iterations append their index to a JSON array state and sleep: $SHORT
# seconds, or $LONG in iteration $SLOW_AT. When its sleep is killed while stopping (SIGTERM to
# the whole process group, as cairn does), it abandons the iteration; when SIGTERM reaches
# only the worker, the iteration finishes.
cat > "$tmp/worker.sh" << 'EOF'
. "$CAIRN_SH"
cairn_trap_term
i=$(cairn_resume_iteration) || exit 1
state=$(cairn_resume_state) || exit 1
[ "$state" = null ] && state='[]'
while [ "$i" -lt 100 ]; do
    cairn_stopping && exit 75
    pause=$SHORT
    [ "$i" -eq "$SLOW_AT" ] && pause=$LONG
    # The work: a child process (so "start" is logged once it exists) that sleeps.
    sh -c 'echo "start $1"; exec sleep "$2"' work "$i" "$pause" || { cairn_stopping && exit 75; exit 1; }
    if [ "$state" = '[]' ]; then state="[$i]"; else state="${state%]},$i]"; fi
    i=$((i + 1))
    cairn_checkpoint "$i" "$state"
done
cairn_output "$state"
EOF

# checkpoints N: the lines the worker sends for completed iterations 0 .. N-1.
checkpoints() {
    n=1 state=0
    while [ "$n" -le "$1" ]; do
        printf '{"checkpoint":{"iteration":%d,"state":[%s]}}\n' "$n" "$state"
        state="$state,$n" n=$((n + 1))
    done
}

# run_and_stop KILL_TARGET SHORT LONG: start the worker, SIGTERM KILL_TARGET ("group" or
# "worker") during iteration 2, wait; sets $status and leaves the channel in $tmp/received.
run_and_stop() {
    open_channel
    : > "$tmp/log"
    CAIRN_CHANNEL=$tmp/channel CAIRN_SH=$here/cairn.sh SHORT=$2 LONG=$3 SLOW_AT=2 \
        setsid sh "$tmp/worker.sh" > "$tmp/log" 2> "$tmp/stderr" 9>&- &
    pid=$!
    wait_for_line "$tmp/log" "start 2"
    if [ "$1" = group ]; then kill -TERM "-$pid"; else kill -TERM "$pid"; fi
    wait "$pid"
    status=$?
    close_channel
}

if command -v setsid > /dev/null 2>&1; then
    # The group: iteration 2's sleep is killed too, so the worker abandons iteration 2.
    run_and_stop group 0.05 5
    check "SIGTERM to the group: exit 75" 75 "$status"
    check "SIGTERM to the group: iteration 2 abandoned" "start 0
start 1
start 2" "$(cat "$tmp/log")"
    check "SIGTERM to the group: checkpoints 1, 2" "$(checkpoints 2)" "$(cat "$tmp/received")"

    # Only the worker: the running sleep ends normally; the trap lets the iteration finish.
    run_and_stop worker 0.05 0.3
    last=$(sed -n '$s/^start //p' "$tmp/log")
    check "SIGTERM to the worker: exit 75" 75 "$status"
    check "SIGTERM to the worker: stopped in iteration 2 or later" yes "$([ "$last" -ge 2 ] && echo yes)"
    check "SIGTERM to the worker: the current iteration finished and was checkpointed" \
        "$(checkpoints $((last + 1)))" "$(cat "$tmp/received")"
else
    echo "skip SIGTERM tests: no setsid to give the worker its own process group"
fi

# --- acknowledgements -------------------------------------------------------------------------
# A fake cairn: the channel as above, and an ack pipe this shell holds open for reading and
# writing on fd 8 (as cairn holds it), answering by hand. Workers run without fds 8 and 9.
open_ack() {
    open_channel
    rm -f "$tmp/ack"
    mkfifo "$tmp/ack"
    exec 8<> "$tmp/ack"
}

# A worker sending checkpoints 1..3 and logging each outcome.
cat > "$tmp/acker.sh" << 'EOF'
. "$CAIRN_SH"
cairn_trap_term
for n in 1 2 3; do
    if cairn_checkpoint "$n" "[$n]"; then
        echo "committed ${CAIRN_COMMITTED:-none}"
    else
        echo "refused $?"
    fi
done
if cairn_stopping; then echo stopping; fi
EOF
# wait_until_reading_ack PID: poll (up to 120 s) until process PID has $tmp/ack open.
wait_until_reading_ack() {
    n=0
    until ls -l "/proc/$1/fd" 2> /dev/null | grep -q " -> $tmp/ack\$"; do
        n=$((n + 1))
        [ "$n" -le 2400 ] || { echo "timed out waiting for the worker to open $tmp/ack"; return 1; }
        sleep 0.05
    done
}

start_acker() {
    : > "$tmp/log"
    CAIRN_CHANNEL=$tmp/channel CAIRN_ACK=$tmp/ack CAIRN_SH=$here/cairn.sh \
        sh "$tmp/acker.sh" > "$tmp/log" 2> "$tmp/stderr" 8>&- 9>&- &
    pid=$!
}
ack_line() {
    printf '{"checkpoint":{"iteration":%d,"state":[%d]},"ack":true}' "$1" "$1"
}

open_ack
start_acker
wait_for_line "$tmp/received" "$(ack_line 1)"
sleep 0.3
check "ack: the checkpoint waits for its answer" "" "$(cat "$tmp/log")"
printf '%s\n' '{"checkpoint":1,"committed":1}' >&8
wait_for_line "$tmp/received" "$(ack_line 2)"
# An answer to an older checkpoint is not this one's; with checkpoint_every > 1 the committed
# count lags behind.
printf '%s\n' '{"checkpoint":1,"committed":1}' '{"checkpoint":2,"committed":1}' >&8
wait_for_line "$tmp/received" "$(ack_line 3)"
printf '%s\n' '{"error":"not a channel message (bad)"}' >&8
wait "$pid"
status=$?
exec 8>&-
close_channel
check "ack: exit 0" 0 "$status"
check "ack: each outcome" "committed 1
committed 1
refused 1" "$(cat "$tmp/log")"
check "ack: a refusal says why" 'cairn refused a line: {"error":"not a channel message (bad)"}' \
    "$(cat "$tmp/stderr")"

# SIGTERM while waiting (trapped): the wait goes on until the answer comes.
open_ack
start_acker
wait_for_line "$tmp/received" "$(ack_line 1)"
kill -TERM "$pid"
sleep 0.3
check "ack, SIGTERM: still waiting" "" "$(cat "$tmp/log")"
printf '%s\n' '{"checkpoint":1,"committed":1}' '{"checkpoint":2,"committed":2}' \
    '{"checkpoint":3,"committed":3}' >&8
wait "$pid"
status=$?
exec 8>&-
close_channel
check "ack, SIGTERM: every answer taken" "0 committed 1
committed 2
committed 3
stopping" "$status $(cat "$tmp/log")"

# cairn gone while the worker waits: exit 75 with one line on stderr. The pipe is closed only
# once the worker has it open: a reader opening a FIFO with no writer left would wait for one.
open_ack
start_acker
wait_for_line "$tmp/received" "$(ack_line 1)"
wait_until_reading_ack "$pid"
exec 8>&-
wait "$pid"
status=$?
close_channel
check "ack, cairn gone: exit 75" 75 "$status"
check "ack, cairn gone: says so" "cairn: channel closed (no answer: cairn is gone); exiting with status 75" \
    "$(cat "$tmp/stderr")"

# Opting out: CAIRN_CHECKPOINT_WAIT=0 sends plain checkpoints and never waits (nobody answers).
open_ack
CAIRN_CHECKPOINT_WAIT=0 CAIRN_CHANNEL=$tmp/channel CAIRN_ACK=$tmp/ack CAIRN_SH=$here/cairn.sh \
    sh "$tmp/acker.sh" > "$tmp/log" 2>&1 8>&- 9>&-
status=$?
exec 8>&-
close_channel
check "no wait: nothing to wait for" "0 committed none
committed none
committed none" "$status $(cat "$tmp/log")"
check "no wait: plain checkpoint lines" '{"checkpoint":{"iteration":1,"state":[1]}}
{"checkpoint":{"iteration":2,"state":[2]}}
{"checkpoint":{"iteration":3,"state":[3]}}' "$(cat "$tmp/received")"

# --- a run that is not stopped ends with exit 0 and its output --------------------------------
printf '%s\n' '{"iteration":97,"state":[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,32,33,34,35,36,37,38,39,40,41,42,43,44,45,46,47,48,49,50,51,52,53,54,55,56,57,58,59,60,61,62,63,64,65,66,67,68,69,70,71,72,73,74,75,76,77,78,79,80,81,82,83,84,85,86,87,88,89,90,91,92,93,94,95,96]}' > "$tmp/resume.json"
open_channel
CAIRN_CHANNEL=$tmp/channel CAIRN_RESUME=$tmp/resume.json CAIRN_SH=$here/cairn.sh SHORT=0 LONG=0 SLOW_AT=-1 \
    sh "$tmp/worker.sh" > "$tmp/log" 2>&1 9>&-
status=$?
close_channel
check "resumed run: exit 0" 0 "$status"
check "resumed run: starts at iteration 97" "start 97
start 98
start 99" "$(cat "$tmp/log")"
check "resumed run: last checkpoints and output" "$(checkpoints 100 | tail -n 3)
{\"output\":[$(checkpoints 100 | sed -n '$s/.*\[\(.*\)\]}}$/\1/p')]}" "$(cat "$tmp/received")"

if [ "$failures" -ne 0 ]; then
    echo "$failures check(s) failed"
    exit 1
fi
echo "all checks passed"
