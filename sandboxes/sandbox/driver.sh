# shellcheck shell=bash
# The driver: the root end of a sandbox's shell protocol and its watchdog (sandboxes/driver.py says how).
__nonce=$1 __head=$2 __tail=$3 __root=$4 __outroot=$5 __restore=$6 __ush_src=$7 __uid=$8 __gid=$9
__state=${10} __reset_prelude=${11} __capture=${12}
__umask0=$(umask)  # the agent's processes get the exec's umask; the driver's own files are private
umask 077
(( EUID == 0 )) || exit 72  # a driver the agent's uid owns could be forged by the agent: refuse
__ctl=$__root/sessions/$__nonce __out=$__outroot/$__nonce __hist=$__root/history __bin=$__root/bin
__ustate=$__state-$__nonce  # the user shell's checkpoint: the agent's own state, kept where it can write
mkdir -p -- "$__ctl" "$__hist" || exit 70
# shellcheck disable=SC2174  # their parents exist: -m is meant for these two alone
mkdir -m 0711 -p -- "$__bin" "$__out" || exit 70
(umask 022; : >"$__out/cmd") || exit 70  # the command of the step: the user shell may read it, not write
if [[ ! -x $__bin/bash ]]; then  # runnable but unreadable by the agent: the user shell is non-dumpable
  install -m 0711 -T -- "$BASH" "$__bin/bash.$$" && mv -f -- "$__bin/bash.$$" "$__bin/bash" || exit 73
fi
mkfifo -- "$__ctl/cmd.fifo" "$__ctl/rc.fifo" "$__ctl/sleep.fifo" || exit 71
exec {__cmdw}<>"$__ctl/cmd.fifo" {__rcr}<>"$__ctl/rc.fifo" {__zz}<>"$__ctl/sleep.fifo"
# Absolute paths: the user shell starts under `env -i`, with no PATH.
if __p=$(type -P setpriv); then __as_agent=("$__p" "--reuid=$__uid" "--regid=$__gid" --clear-groups --)
elif __p=$(type -P chroot); then __as_agent=("$__p" "--userspec=$__uid:$__gid" --groups= --skip-chdir /)
else exit 74; fi
# The agent's environment is the container's (image ENV + the spec's variables), as PID 1 got it;
# the driver itself runs without it (see layout.privileged_argv).
__base=
while IFS= read -r -d '' __kv; do
  __n=${__kv%%=*}
  [[ $__kv == *=* && $__n == [A-Za-z_]* && $__n != *[!A-Za-z0-9_]* ]] || continue
  printf -v __q '%q' "${__kv#*=}"
  __base+="export $__n=$__q"$'\n'
done </proc/1/environ
unset __kv __n __q
__oomf=
for __f in /sys/fs/cgroup/memory/memory.oom_control /sys/fs/cgroup/memory.events; do
  [[ -r $__f ]] && { __oomf=$__f; break; }
done
__pidsf='' __pidsmax=''
for __f in /sys/fs/cgroup/pids/pids.current /sys/fs/cgroup/pids.current; do
  [[ -r $__f ]] && { __pidsf=$__f; read -r __pidsmax <"${__f%.current}.max"; break; }
done
__ush_pid='' __oom=0 __rc=0 __st=ok __linger=() __stale=() __probe=$__out/.probe __probe_data=''
declare -A __idle=()
printf -v __probe_data '%4096s' ''

__read_oom() {  # oom_kill counter of this container's memory cgroup
  local k v; __oom=0
  [[ -n $__oomf ]] || return 0
  while read -r k v; do [[ $k == oom_kill ]] && __oom=$v; done <"$__oomf"
}

__agent_pids() {  # pids of the agent's uid, from /proc (builtins only: works when no fork is possible)
  local p k u
  __pids=()
  for p in /proc/[0-9]*; do
    while read -r k u _; do
      [[ $k == Uid: ]] && { [[ $u == "$__uid" ]] && __pids+=("${p#/proc/}"); break; }
    done <"$p/status" 2>/dev/null
  done
}

__make_room() {  # before the driver forks: if the user's processes hold the pids limit, kill them all
  local cur i
  [[ -n $__pidsf && $__pidsmax =~ ^[0-9]+$ ]] || return 0
  read -r cur <"$__pidsf" 2>/dev/null || return 0
  (( cur + 4 < __pidsmax )) && return 0
  # A fork here would stall in bash's fork retry (15 s) and then end the driver, so nothing of the
  # user's survives: the command's group first (like a timeout), then every other process of the uid.
  __kill_ush
  for (( i = 0; i < 100; i++ )); do
    __agent_pids
    (( ${#__pids[@]} )) || break
    kill -KILL "${__pids[@]}" 2>/dev/null
    __nap 0.01
  done
  __st=pids_exhausted
}

__nap() { read -r -t "$1" -u "$__zz" __ignored; }  # sleep without a fork: nothing ever writes there

__ensure_ush() {
  if [[ -n $__ush_pid ]]; then kill -0 "$__ush_pid" 2>/dev/null && return 0; wait "$__ush_pid" 2>/dev/null; fi
  __make_room
  # `env -i`: the user shell restores exactly the checkpointed environment, or the container's.
  umask "$__umask0"
  env -i setsid nice -n 19 "${__as_agent[@]}" "$__bin/bash" --noprofile --norc -c "$__ush_src" crucible-shell \
    "$__out" "$__ustate" "$__restore" "$__base" \
    <"$__ctl/cmd.fifo" >"$__ctl/rc.fifo" 2>/dev/null {__cmdw}>&- {__rcr}<&- {__zz}<&- &
  __ush_pid=$!
  umask 077
}

__drain_rc() {  # forget answers a killed shell may have left in the pipe
  local line
  while read -r -t 0 -u "$__rcr"; do IFS= read -r -t 0.01 -u "$__rcr" line || break; done
}

__kill_ush() {  # what `timeout -k 2` does: TERM the whole process group, KILL it 2 s later
  [[ -n $__ush_pid ]] || return 0
  local i
  kill -TERM -- "-$__ush_pid" 2>/dev/null
  for (( i = 0; i < 40; i++ )); do kill -0 -- "-$__ush_pid" 2>/dev/null || break; __nap 0.05; done
  for (( i = 0; i < 100; i++ )); do  # members forking while we kill (a fork bomb) need more rounds
    kill -KILL -- "-$__ush_pid" 2>/dev/null || break
    __nap 0.01
  done
  wait "$__ush_pid" 2>/dev/null
  __ush_pid=
  __drain_rc
}

__wait_rc() {  # $1 seq, $2 token, $3 timeout ms -> __rc, __st
  # `read -t` reads a pipe a byte at a time, and when its timer fires mid-line it has already consumed
  # the bytes it read: it returns them in the variable and fails. They are kept in `part` and the line
  # is completed by the next read; dropping them would turn "12 ab 0" into " 0", a reply that never
  # matches, and a finished command would then wait out its whole deadline and be reported as timeout.
  local deadline=$(( ${EPOCHREALTIME/./} + $3 * 1000 )) left s line part='' forged=''
  while :; do
    left=$(( deadline - ${EPOCHREALTIME/./} ))
    if (( left <= 0 )); then __kill_ush; __rc=124; __st=timeout; return; fi
    (( left > 250000 )) && left=250000
    printf -v s '%d.%06d' $(( left / 1000000 )) $(( left % 1000000 ))
    line=
    if IFS= read -r -t "$s" -u "$__rcr" line; then
      line=$part$line part=
      s=${line#"$1 $2 "}  # (no regex: compiling one costs more than the rest of a step)
      if [[ $s != "$line" && -n $s && $s != *[!0-9]* ]]; then
        __rc=$s __st=ok
        [[ -n $forged ]] && __st=control_tampered
        return
      fi
      # Anything else claiming this step was not written by the shell we asked (it lacks the token).
      [[ $line == "$1 "* ]] && forged=1
    elif read -t 0 -u 0; then
      # The host sends nothing while a command runs, so input now means it hung up (its end of the
      # attached stream closed: a SIGKILLed `crucible sandbox exec`, a host that gave up): the command
      # must not outlive the caller that was waiting for it.
      __kill_ush; : >"$__f"; exit 0  # (and its output gives its space back)
    elif part+=$line; ! kill -0 "$__ush_pid" 2>/dev/null; then
      wait "$__ush_pid" 2>/dev/null; __rc=$? __st=exited __ush_pid=
      [[ -n $forged ]] && __st=control_tampered
      return
    fi
  done
}

__reply() {  # $1 rc, $2 status, $3 output file or "", $4 start (us)
  local size=0 nh=0 nt=0 dur=$(( ${EPOCHREALTIME/./} - $4 ))
  if [[ -n $3 && -s $3 ]]; then
    __make_room
    size=$(stat -c %s -- "$3" 2>/dev/null) || size=0
    if (( size <= __head + __tail )); then nh=$size; else nh=$__head nt=$__tail; fi
  fi
  printf '\x1e\x1eCRUCIBLE %s %s %s %s %s %s %s %s\n' "$__nonce" "$__seq" "$1" "$2" "$size" "$nh" "$nt" "$dur"
  (( nh > 0 )) && { head -c "$nh" -- "$3" || __pad "$nh"; }
  (( nt > 0 )) && { tail -c "$nt" -- "$3" || __pad "$nt"; }
  return 0
}

__pad() { local i; for (( i = 0; i < $1; i++ )); do printf ' '; done; }  # keep the framing if head failed

__has_room() {  # can the capture tmpfs take one more page? (a write, then the space given back)
  local ok=0
  printf '%s' "$__probe_data" >"$__probe" 2>/dev/null || ok=1
  : >"$__probe" 2>/dev/null
  return $ok
}

__reclaim() {  # empty earlier steps' files again: a background process may still be writing to one
  local f keep=()
  for f in "${__linger[@]}"; do
    if [[ -s $f ]]; then : >"$f"; __idle[$f]=0; keep+=("$f")  # written since: watch it on
    elif (( ++__idle[$f] < 4 )); then keep+=("$f")
    else __stale+=("$f"); unset '__idle[$f]'; fi  # quiet for 4 steps: unlinked with the next batch
  done
  __linger=("${keep[@]}")
  if (( ${#__stale[@]} >= 32 )); then __make_room; rm -f -- "${__stale[@]}"; __stale=(); fi
}

__room() {  # __has_room, after emptying the files that left the watch list but are not unlinked yet
  __has_room && return 0
  local f
  for f in "${__stale[@]}"; do [[ -s $f ]] && : >"$f"; done
  __has_room
}

__new_output() {  # -> __f: this step's output file, writable by the agent's shell, in a dir it cannot list
  __f=$__out/$SRANDOM$SRANDOM
  umask 0155
  : >"$__f" 2>/dev/null
  local ok=$?
  umask 077
  return $ok
}

__done_output() {  # the reply is sent: give the space back at once, keep watching the file a while
  : >"$__f" 2>/dev/null
  __linger+=("$__f")
}

__history() {  # $1 t0, $2 rc, $3 status -> fails when the control tmpfs cannot take it
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$__nonce" "$__seq" "$1" "$(( ${EPOCHREALTIME/./} - $1 ))" "$2" "$3" \
    >>"$__hist/index.tsv" 2>/dev/null || return 1
  # A ring of 256 per session; the first line names the step so an overwritten slot is never misread.
  printf '%s\n%s' "$__seq" "${__payload:0:16384}" >"$__hist/$__nonce-$(( __seq % 256 )).cmd" 2>/dev/null
}

__lease() {  # readable by all (the reaper reads it as the keeper), writable by root alone
  local rc
  umask 022
  printf '%s\n' "$__payload" >"$__root/lease" 2>/dev/null
  rc=$?
  umask 077
  if (( rc == 0 )); then __reply 0 ok "" "${EPOCHREALTIME/./}"; else __reply 1 control_full "" "${EPOCHREALTIME/./}"; fi
}

__step() {
  local t0=${EPOCHREALTIME/./} tok oom0 size
  __reclaim
  if ! __new_output; then __reply 0 control_full "" "$t0"; return; fi
  if ! __room; then __reply 0 capture_full "" "$t0"; return; fi
  tok=${__f##*/}
  __ensure_ush
  __read_oom; oom0=$__oom
  printf '%s' "$__payload" >"$__out/cmd" || { __reply 0 capture_full "" "$t0"; return; }
  printf '%s %s\n' "$__seq" "$tok" >&"$__cmdw"
  __wait_rc "$__seq" "$tok" "$__arg"
  __read_oom; (( __oom > oom0 )) && __st=oom
  __make_room
  if [[ $__st == ok ]] && ! __room; then
    # Full after the command: fine if its own output filled it (that is truncation), a fault otherwise.
    size=0; [[ -s $__f ]] && { size=$(stat -c %s -- "$__f" 2>/dev/null) || size=0; }
    (( size * 2 < __capture )) && __st=capture_full
  fi
  __history "$t0" "$__rc" "$__st" || __st=control_full
  __reply "$__rc" "$__st" "$__f" "$t0"
  __done_output
}

__reset() {  # kill every process of the agent, then run the payload script as the agent
  local t0=${EPOCHREALTIME/./} rc
  __reclaim
  if ! __new_output; then __reply 1 control_full "" "$t0"; return; fi
  if [[ -n $__ush_pid ]]; then  # ours first: a zombie child of the driver would count as a survivor
    kill -KILL -- "-$__ush_pid" 2>/dev/null; wait "$__ush_pid" 2>/dev/null; __ush_pid=
  fi
  __restore=
  __make_room
  ( umask "$__umask0"; exec "${__as_agent[@]}" "$__bin/bash" --noprofile --norc -c "$__reset_prelude$__payload" crucible-reset "$__zz" ) \
    </dev/null >>"$__f" 2>&1 {__cmdw}>&- {__rcr}<&-
  rc=$?
  __drain_rc
  : >"$__hist/index.tsv" 2>/dev/null  # history is since the last reset
  if (( rc == 125 )); then __reply 125 busy "$__f" "$t0"; else __reply "$rc" ok "$__f" "$t0"; fi
  __done_output
}

__seq=0
__reply 0 ready "" "${EPOCHREALTIME/./}"
while IFS=' ' LC_ALL=C read -r __op __seq __arg __len; do
  __payload=
  if (( __len > 0 )); then LC_ALL=C read -r -N "$__len" __payload || break; fi
  case $__op in
    x) __step ;;
    r) __reset ;;
    l) __lease ;;
    p) __reply 0 ok "" "${EPOCHREALTIME/./}" ;;
    q) break ;;
    *) __reply 2 bad_request "" "${EPOCHREALTIME/./}" ;;
  esac
done
[[ -n $__ush_pid ]] && { kill -KILL -- "-$__ush_pid" 2>/dev/null; wait "$__ush_pid" 2>/dev/null; }
exit 0
