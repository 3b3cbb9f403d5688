# shellcheck shell=bash
# The graded test run, as root (grader.py says how): $1 the run's directory, $2 its time limit, then run.py's.

dir=$1 limit=$2; shift 2
run="$dir-run"
mkdir -m 755 "$run" || exit 90
owner=$(stat -c %u:%g /workspace) || exit 91
as_agent=(setpriv --reuid="${owner%:*}" --regid="${owner#*:}" --clear-groups --)
as_keeper=(setpriv --reuid=65534 --regid=65534 --clear-groups --)
"${as_agent[@]}" mkdir -p "$dir-home"
cd /workspace || exit 92
started=$(date +%s)
# shellcheck disable=SC2016  # the reader's $1 is the argument of the inner sh, expanded there
{
  timeout -k 5 "$limit" "${as_agent[@]}" env -i PATH=/usr/local/bin:/usr/bin:/bin HOME="$dir-home" LANG=C.UTF-8 \
    PYTHONHASHSEED=0 PYTHONDONTWRITEBYTECODE=1 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 \
    python3 -s -P -B "$dir/run.py" 3 "$@" 3>&1 >"$run/log" 2>&1 </dev/null
  status=$?
  # Whatever the tests left running holds the pipe's write end: stopped (again while any is left, so a
  # process that keeps forking cannot outlast it), so the reader sees its end.
  for _ in $(seq 50); do "${as_agent[@]}" sh -c 'kill -9 -1 2>/dev/null' || break; done
  elapsed=$(( $(date +%s) - started ))
  timed=0; { [ "$status" = 124 ] || [ "$elapsed" -ge "$limit" ]; } && timed=1
  echo "$status $timed" > "$run/status"
} | "${as_keeper[@]}" sh -c 'head -c 33554432 > "$1/report.part"; mv "$1/report.part" "$1/report.json"' reader "$dir"
exit 0
