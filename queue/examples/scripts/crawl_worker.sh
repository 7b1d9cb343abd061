#!/bin/sh
# A long-running `worker` phase in shell: "crawls" 20 pages, checkpointing after each one.
#
# cairn starts this once and it loops by itself, reporting through clients/sh/cairn.sh. Stop
# the daemon midway (Ctrl-C) and start it again: the page being fetched is abandoned (cairn's
# SIGTERM stops the fetch too), the worker exits 75, and the next run continues from that page.
# It also runs on its own, from the queue directory's parent:
#   CAIRN_CLIENTS=$(cairn clients-path) sh queue/examples/scripts/crawl_worker.sh
# (CAIRN_DEBUG=1 shows the messages).
set -u

# cairn gives every command CAIRN_CLIENTS, the directory where the daemon wrote its helpers.
if [ -z "${CAIRN_CLIENTS:-}" ]; then
    echo "crawl_worker.sh: CAIRN_CLIENTS is not set; outside cairn, set it to \$(cairn clients-path)" >&2
    exit 1
fi
. "$CAIRN_CLIENTS/sh/cairn.sh"

PAGES=20

# fetch N: print the size of page N (stands in for a download).
fetch() {
    sleep 0.3 && echo $(((($1 * 7919) % 5000) + 1000))
}

cairn_trap_term
page=$(cairn_resume_iteration) || exit 1
state=$(cairn_resume_state) || exit 1
[ "$state" = null ] && state='{"bytes":0}'
bytes=$(printf '%s\n' "$state" | sed 's/.*"bytes":\([0-9]*\).*/\1/')
[ "$page" -eq 0 ] || echo "resuming at page $page" >&2

while [ "$page" -lt "$PAGES" ]; do
    cairn_stopping && exit 75
    cairn_heartbeat
    # A fetch cut short by the stop is abandoned: page $page is fetched again on resume.
    size=$(fetch "$page") || { cairn_stopping && exit 75; exit 1; }
    bytes=$((bytes + size))
    page=$((page + 1))
    cairn_cost 0.001
    cairn_checkpoint "$page" "{\"bytes\":$bytes}"
    cairn_progress "$page" "$PAGES"
    echo "page $((page - 1)): $size bytes" >&2
done

cairn_output "{\"pages\":$PAGES,\"bytes\":$bytes}"
