# shellcheck shell=bash
# A Harbor task's tests (a tar on stdin), unpacked by root where the adapted image's /tests and /logs lead
# (environments/harbor/images.py). This sandbox is fresh and nothing of the submission has run in it (our git ran
# with an empty environment), so nothing is there before us: mkdir without -p, and any leftover is a fault.
# /tests is root's (the tests cannot change it); /logs is root's, sticky and open, so that the workspace's owner
# makes /logs/verifier and /logs/agent in it, and test.sh's HOME, all three new.

set -e
root=/tmp/crucible-harbor
owner=$(stat -c %u:%g /workspace)
mkdir -m 755 "$root" "$root/tests"
mkdir -m 1777 "$root/logs"
tar -x --no-same-owner --no-same-permissions -C "$root/tests" -f -
chmod -R a+rX "$root/tests"
find "$root/tests" -type f -exec chmod 755 {} +
setpriv --reuid="${owner%:*}" --regid="${owner#*:}" --clear-groups -- \
  mkdir -m 755 "$root/logs/verifier" "$root/logs/agent" "$root-home"
