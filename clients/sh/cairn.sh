# cairn.sh: helpers for a cairn `worker` phase written in POSIX sh. Source it:
#
#   . "$CAIRN_CLIENTS/sh/cairn.sh"
#   cairn_trap_term                            # SIGTERM: stop between iterations
#   i=$(cairn_resume_iteration) || exit 1      # 0 on a fresh start
#   total=$(cairn_resume_state) || exit 1      # the state JSON, null on a fresh start
#   [ "$total" = null ] && total=0
#   while [ "$i" -lt 30 ]; do
#       cairn_stopping && exit 75              # interrupted: cairn resumes us later
#       total=$((total + i * i)); i=$((i + 1))  # one iteration of work
#       cairn_checkpoint "$i" "$total"; cairn_progress "$i" 30
#   done
#   cairn_output "{\"total\":$total}"
#
# The daemon sends SIGTERM to the worker's whole process group: a command running in the
# current iteration is stopped too, so an iteration whose command failed while
# `cairn_stopping` is true should be abandoned (exit 75 without checkpointing it).
#
# Each message is one line `printf '%s\n' "$msg" >> "$CAIRN_CHANNEL"` (a FIFO that cairn
# reads). cairn_checkpoint then waits for cairn's answer on the FIFO $CAIRN_ACK, so that the
# next iteration starts only once this one is committed and a crash re-runs at most the
# iteration in flight; CAIRN_CHECKPOINT_WAIT=0 sends checkpoints without waiting (faster on a
# slow disk, but a crash may then re-run every iteration whose checkpoint was on its way). Without CAIRN_CHANNEL (outside cairn) messages are dropped, or printed to stderr
# when CAIRN_DEBUG is set. JSON arguments are passed through as they are: give valid JSON.
# Names starting with `_cairn` are private.

# Send one message line (a JSON object) to cairn.
cairn_send() {
    if [ -z "${CAIRN_CHANNEL:-}" ]; then
        [ -z "${CAIRN_DEBUG:-}" ] || printf 'cairn: %s\n' "$1" >&2
        return 0
    fi
    printf '%s\n' "$1" >> "$CAIRN_CHANNEL"
}

# cairn_checkpoint ITERATION STATE_JSON: iterations 0 .. ITERATION-1 are done, with this state.
# Inside cairn, returns once cairn has committed it (or, with checkpoint_every > 1, handled it);
# the committed iteration count is then in $CAIRN_COMMITTED. Status 1 if cairn refused the line
# (invalid JSON), with cairn's reason on stderr.
cairn_checkpoint() {
    _cairn_count iteration "$1" || return
    if [ -z "${CAIRN_ACK:-}" ] || [ -z "${CAIRN_CHANNEL:-}" ] ||
        [ "${CAIRN_CHECKPOINT_WAIT:-1}" = 0 ]; then
        cairn_send "{\"checkpoint\":{\"iteration\":$1,\"state\":$2}}"
        return
    fi
    cairn_send "{\"checkpoint\":{\"iteration\":$1,\"state\":$2},\"ack\":true}" &&
        _cairn_await_ack "$1"
}

# cairn_progress DONE TOTAL: for display.
cairn_progress() {
    _cairn_count done "$1" && _cairn_count total "$2" &&
        cairn_send "{\"progress\":{\"done\":$1,\"total\":$2}}"
}

# cairn_cost AMOUNT: the cost of the work since the last cost message (a JSON number).
cairn_cost() {
    case $1 in
        '' | *[!0-9.eE+-]*) echo "cairn_cost: not a number: '$1'" >&2; return 2 ;;
    esac
    cairn_send "{\"cost\":$1}"
}

# cairn_output JSON: the phase's output; the last one sent wins.
cairn_output() {
    cairn_send "{\"output\":$1}"
}

# cairn_heartbeat: "still alive", for a phase's heartbeat_timeout.
cairn_heartbeat() {
    cairn_send '{"heartbeat":true}'
}

# cairn_resume_iteration: print the number of completed iterations (0 on a fresh start).
cairn_resume_iteration() {
    _cairn_resume_field 's/^{"iteration":\([0-9][0-9]*\),"state":.*}$/\1/p' 0
}

# cairn_resume_state: print the saved state JSON (`null` on a fresh start).
cairn_resume_state() {
    _cairn_resume_field 's/^{"iteration":[0-9][0-9]*,"state":\(.*\)}$/\1/p' null
}

# cairn_trap_term: from now on SIGTERM only marks the worker as stopping (see cairn_stopping).
cairn_trap_term() {
    _cairn_stop=
    trap '_cairn_stop=1 _cairn_signals=$((${_cairn_signals:-0} + 1))' TERM
}

# cairn_stopping: true (0) once SIGTERM arrived after cairn_trap_term.
cairn_stopping() {
    [ -n "${_cairn_stop:-}" ]
}

# _cairn_await_ack ITERATION: read cairn's answers until the one to checkpoint ITERATION
# ({"checkpoint":N,"committed":C} with N >= ITERATION; older ones are left over from checkpoints
# sent without waiting) or a refusal ({"error":...}). No time limit: cairn answers, or stops the
# worker, or is gone (end of file: exit 75, as when the channel is gone). A trapped SIGTERM cuts
# a read short (dash); the wait then goes on.
_cairn_await_ack() {
    while :; do
        _cairn_seen=${_cairn_signals:-0}
        if IFS= read -r _cairn_answer; then
            case $_cairn_answer in
                '{"checkpoint":'*',"committed":'*'}')
                    _cairn_n=${_cairn_answer#'{"checkpoint":'}
                    _cairn_n=${_cairn_n%%,*}
                    if [ "$_cairn_n" -ge "$1" ]; then
                        CAIRN_COMMITTED=${_cairn_answer##*'"committed":'}
                        CAIRN_COMMITTED=${CAIRN_COMMITTED%'}'}
                        return 0
                    fi
                    ;;
                '{"error":'*)
                    printf 'cairn refused a line: %s\n' "$_cairn_answer" >&2
                    return 1
                    ;;
            esac
        elif [ "${_cairn_signals:-0}" = "$_cairn_seen" ]; then
            echo "cairn: channel closed (no answer: cairn is gone); exiting with status 75" >&2
            exit 75
        fi
    done < "$CAIRN_ACK"
}

# CAIRN_RESUME holds one line, {"iteration":N,"state":JSON}; print what sed script $1 takes
# from it, or $2 without CAIRN_RESUME. A file that is set but unreadable is an error.
_cairn_resume_field() {
    if [ -z "${CAIRN_RESUME:-}" ]; then
        printf '%s\n' "$2"
        return 0
    fi
    _cairn_value=$(sed -n "$1" "$CAIRN_RESUME") || return 1
    if [ -z "$_cairn_value" ]; then
        echo "cairn: $CAIRN_RESUME is not a checkpoint of the form {\"iteration\":N,\"state\":...}" >&2
        return 1
    fi
    printf '%s\n' "$_cairn_value"
}

# _cairn_count NAME VALUE: succeed if VALUE is a whole number, else complain.
_cairn_count() {
    case $2 in
        '' | *[!0-9]*) echo "cairn: $1 must be a whole number, not '$2'" >&2; return 2 ;;
    esac
}
