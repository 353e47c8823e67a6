#!/usr/bin/env bash
# The repository stands alone: no tracked file may point at the notes and references kept outside it
# (the `shared` directory next to the checkout). Lists every offending line and exits 1 if there is one;
# exits 0 otherwise (2 when git cannot list the files).
#
# Usage: scripts/check-self-contained.sh
#
# The patterns are put together at run time, so this script does not match itself.
set -euo pipefail

cd "$(dirname "$0")/.."

dir=shared
patterns=("../$dir" "$dir/reference" "$dir/design")

args=()
for p in "${patterns[@]}"; do
    args+=(-e "$p")
done

# git grep searches exactly the tracked files (git ls-files), as they are in the work tree.
set +e
hits=$(git grep -n -I -F "${args[@]}" --)
rc=$?
set -e

case $rc in
    0)
        echo "files outside the repository are referenced (use the docs in docs/ instead):" >&2
        printf '%s\n' "$hits" >&2
        exit 1
        ;;
    1)
        echo "self-contained: no tracked file mentions ${patterns[*]}"
        exit 0
        ;;
    *)
        echo "check-self-contained: git grep failed (exit $rc)" >&2
        exit 2
        ;;
esac
