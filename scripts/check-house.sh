#!/usr/bin/env bash
# Two boundaries of the house that grep can hold (ARCHITECTURE.md: invariant 1, and `exit/`):
# - a signal to a PID (nix's or libc's kill/killpg) is sent only by the children registry,
#   src/supervisor/children.rs, which refuses PIDs that would hit the agent's group or every process;
# - an exit status is made only in src/exit/ and by main.rs's one `ExitCode::from(run())`; no literal
#   status is passed to process::exit.
# A `Child` handle's own kill() is not a PID signal (it cannot reach a reused PID) and is not counted.
# Lists every offending line and exits 1 if there is one; 0 otherwise.
#
# Usage: scripts/check-house.sh
set -euo pipefail
cd "$(dirname "$0")/.."

bad=0
report() { # $1: what is wrong; stdin: the lines
    local hits
    hits=$(cat)
    if [ -n "$hits" ]; then
        echo "$1:" >&2
        printf '%s\n' "$hits" >&2
        bad=1
    fi
}

# Process substitution, not a pipe: `report` must run in this shell to set `bad`.
report "signals sent outside src/supervisor/children.rs" < <(
    git grep -n -E '(\bkillpg\b|signal::kill\b|libc::kill\b|[^_.a-z]kill\((Pid|pid|-|[0-9]))|use nix::sys::signal::\{[^}]*\bkill' \
        -- 'src/*.rs' ':!src/supervisor/children.rs' || true
)
report "exit statuses made outside src/exit/" < <(
    git grep -n -E 'ExitCode::from|process::exit\([0-9]' -- 'src/*.rs' ':!src/exit/*' ':!src/main.rs' || true
)
report "main.rs makes its exit status more than once" < <(
    git grep -c -F 'ExitCode::from' -- src/main.rs | grep -v -x 'src/main.rs:1' || true
)

[ "$bad" = 0 ] && echo "house: signals only from children.rs, exit statuses only from exit/"
exit "$bad"
