# shellcheck shell=bash
# A Harbor task's tests/test.sh, as root with only SETUID, SETGID and KILL (the sandbox's control user):
# $1 its time limit, $2 the task's working directory, then the verifier's NAME=value pairs. test.sh runs as the
# workspace's owner (the agent's uid: nothing the submission runs gets a privilege the agent lacked), with an
# environment we build: a safe PATH, a new HOME, git refusing a repository it was not pointed at. Then every
# process of that uid is killed with bash's builtins only (a process table the tests filled with forks cannot stop
# it), pass after pass until none is left, so nothing writes after we read. Printed: the status line ("STATUS
# TIMED KILLED"), the output's tail, and each reward file (base64, or -).

limit=$1 workdir=$2; shift 2
root=/tmp/crucible-harbor
owner=$(stat -c %u:%g /workspace) || exit 91
uid=${owner%:*}
cd "$workdir" || exit 92
started=$SECONDS
timeout -k 5 "$limit" setpriv --reuid="$uid" --regid="${owner#*:}" --clear-groups -- \
  env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME="$root-home" LANG=C.UTF-8 \
  GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=safe.bareRepository GIT_CONFIG_VALUE_0=explicit \
  "$@" bash /tests/test.sh >"$root/output" 2>&1 </dev/null
status=$?
elapsed=$(( SECONDS - started ))

killed=0
for _ in {1..200}; do
  found=0
  for file in /proc/[0-9]*/status; do
    state=
    while read -r key value _; do
      if [ "$key" = "State:" ]; then state=$value; fi
      if [ "$key" = "Uid:" ]; then  # a zombie is dead already: only its parent's wait removes it
        if [ "$value" = "$uid" ] && [ "$state" != Z ]; then kill -9 "${file//[^0-9]/}" 2>/dev/null; found=1; fi
        break
      fi
    done 2>/dev/null <"$file"
  done
  if [ "$found" = 0 ]; then killed=1; break; fi
done

timed=0; { [ "$status" = 124 ] || [ "$elapsed" -ge "$limit" ]; } && timed=1
echo "$status $timed $killed"
tail -c 6000 "$root/output" | base64 -w0; echo
verifier=$root/logs/verifier
for name in reward.json reward.txt; do
  file=$verifier/$name
  if [ "$killed" = 1 ] && [ -d "$verifier" ] && [ ! -L "$verifier" ] && [ -f "$file" ] && [ ! -L "$file" ]; then
    head -c 65536 "$file" | base64 -w0; echo
  else
    echo "-"
  fi
done
