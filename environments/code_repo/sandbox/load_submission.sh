# shellcheck shell=bash
# A fresh sandbox's checkout replaced by the submitted tree (a tar on stdin), staged (repo.load_submission);
# repo.py puts its GIT (our git, with our options) in place of the placeholder that starts the `add` line.

set -o pipefail
# shellcheck disable=SC2034  # base ($2) is named with the arguments repo.load_submission passes; unused here
ws=$1 base=$2 attributes=$3
cd "$ws" || exit 3
printf '%s' "$attributes" > .git/info/attributes || exit 3
find . -mindepth 1 -maxdepth 1 ! -name .git -exec rm -rf {} + || exit 4
tar -x --no-same-owner -f - || exit 5
@GIT@ add -A -f >/dev/null || exit 7
