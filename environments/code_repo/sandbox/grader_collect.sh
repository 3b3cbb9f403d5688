# shellcheck shell=bash
# The run's status line, its log's tail (base64, one line) and the report, as the keeper reads them.

dir=$1
cat "$dir-run/status" 2>/dev/null || echo "missing"
tail -c 6000 "$dir-run/log" 2>/dev/null | base64 -w0; echo
cat "$dir/report.json" 2>/dev/null
