# shellcheck shell=bash
# The agent's files as a tar on stdout, capped, read by the keeper (repo.read_workspace).

set -o pipefail
ws=$1 cap=$2; shift 2
cd "$ws" || { echo "no workspace at $ws" >&2; exit 3; }
excludes=(); for pattern in "$@"; do excludes+=(--exclude="$pattern"); done
# Capped inside the sandbox: a sparse file of a terabyte must not reach the worker's memory.
tar -c --numeric-owner "${excludes[@]}" -f - . | head -c "$cap"
