# shellcheck shell=bash
# The grader's keeper unpacks its entry point and ini (a tar on stdin) into a new directory $1.

set -e
dir=$1
mkdir -m 755 "$dir"
tar -x -C "$dir" -f -
