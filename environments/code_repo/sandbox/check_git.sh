# shellcheck shell=bash
# What the agent did to the workspace's history, as one line of key=value (repo.check_git).

ws=$1 base=$2
cd "$ws" 2>/dev/null || { echo "state=no-workspace"; exit 0; }
[ -d .git ] || { echo "state=no-git"; exit 0; }
export HOME=/nonexistent GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null GIT_TERMINAL_PROMPT=0 GIT_NO_REPLACE_OBJECTS=1
g() { git -c safe.directory='*' -c core.hooksPath=/dev/null -c core.fsmonitor=false "$@" 2>/dev/null; }
tag=$(g rev-parse -q --verify 'refs/tags/crucible-base^{commit}') || tag=missing
g merge-base --is-ancestor "$base" HEAD && ancestor=yes || ancestor=no
replaced=no; { [ -n "$(g for-each-ref refs/replace)" ] || [ -s .git/info/grafts ]; } && replaced=yes
echo "state=repo tag=$tag ancestor=$ancestor replaced=$replaced"
