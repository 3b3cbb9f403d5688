r"""The bash programs behind a ShellSession: a driver (protocol + watchdog) and the user's shell.

Why two shells. Commands must run in ONE long-lived shell so `cd`, `export`, functions and variables
persist, yet each command needs a deadline enforced inside the container. `timeout N bash -c CMD`
would lose that state (a fresh shell per command) and a watchdog that signals the shell running the
command cannot stop a builtin loop (`while :; do :; done`) without killing that shell anyway. So:

* the user shell (`setsid bash`, its own process group) evals each command with stdin from
  /dev/null and stdout+stderr to a per-step file in the capture tmpfs, then checkpoints `pwd` and
  `export -p` to files (builtins only: no fork);
* the driver (the process docker exec started, attached to the host socket) reads framed requests,
  hands each command to the user shell, and waits for its exit code with `read -t` (a line that a
  read's timer split is reassembled, see __wait_rc). Past the deadline it does what `timeout -k 2 N`
  does to a process group: SIGTERM the group, SIGKILL it 2 s later. A killed or exited user shell is
  restarted from the last checkpoint (cwd and exported variables survive; unexported variables and
  functions do not), and the reply says so.

The user shell runs at nice 19 with a raised oom_score_adj, so the driver keeps the CPU it needs to
enforce deadlines under a fork bomb or a spin, and the OOM killer picks agent code first.

The hot path of a step is builtins only (read, printf, eval, pwd, export); a fork happens only when
the command produced output (`stat`, then `head`/`tail` to cap it), so `true` costs well under a
millisecond inside the container.

Host -> driver:  `<op> <seq> <arg> <len>\n` + <len> bytes. ops: x (run; arg = timeout ms),
                 r (reset: kill every other process of the user, then run the payload script),
                 l (write the lease file), p (ping), q (quit).
Driver -> host:  `\x1e\x1eCRUCIBLE <nonce> <seq> <rc> <status> <size> <head> <tail> <dur_us>\n`
                 + <head> bytes from the start of the output + <tail> bytes from its end.
                 status: ok | timeout | oom | exited (the user shell ended) | spawn_failed | …
"""

from __future__ import annotations

USER_SHELL = r"""
echo 500 >/proc/self/oom_score_adj 2>/dev/null  # under memory pressure the kernel kills agent code first
__crucible_ctl=$1 __crucible_out=$2 __crucible_src=$3
if [[ -n $__crucible_src ]]; then
  [[ -r $__crucible_src/state.env ]] && . "$__crucible_src/state.env" 2>/dev/null
  if [[ -r $__crucible_src/state.cwd ]] && IFS= read -r __crucible_d <"$__crucible_src/state.cwd"; then
    cd -- "$__crucible_d" 2>/dev/null
  fi
fi
unset __crucible_src __crucible_d
# `builtin`: a user function named read/eval/printf/pwd/export must not hijack the loop.
while IFS= builtin read -r __crucible_seq; do
  IFS= builtin read -r -d '' __crucible_cmd <"$__crucible_ctl/cmd"
  { builtin eval "$__crucible_cmd"$'\n'; } </dev/null >"$__crucible_out/$__crucible_seq" 2>&1
  __crucible_rc=$?
  builtin pwd >"$__crucible_ctl/state.cwd" 2>/dev/null
  builtin export -p >"$__crucible_ctl/state.env" 2>/dev/null
  builtin printf '%s %s\n' "$__crucible_seq" "$__crucible_rc"
done
"""

DRIVER = r"""
__nonce=$1 __head=$2 __tail=$3 __root=$4 __outroot=$5 __restore=$6 __ush_src=$7
__ctl=$__root/sessions/$__nonce __out=$__outroot/$__nonce __hist=$__root/history
mkdir -p -- "$__ctl" "$__out" "$__hist" || exit 70
mkfifo -- "$__ctl/cmd.fifo" "$__ctl/rc.fifo" "$__ctl/sleep.fifo" || exit 71
exec {__cmdw}<>"$__ctl/cmd.fifo" {__rcr}<>"$__ctl/rc.fifo" {__zz}<>"$__ctl/sleep.fifo"
__oomf=
for __f in /sys/fs/cgroup/memory/memory.oom_control /sys/fs/cgroup/memory.events; do
  [[ -r $__f ]] && { __oomf=$__f; break; }
done
__pidsf= __pidsmax=
for __f in /sys/fs/cgroup/pids/pids.current /sys/fs/cgroup/pids.current; do
  [[ -r $__f ]] && { __pidsf=$__f; read -r __pidsmax <"${__f%.current}.max"; break; }
done
__ush_pid= __oom=0 __rc=0 __st=ok __steps=0

__read_oom() {  # oom_kill counter of this container's memory cgroup
  local k v; __oom=0
  [[ -n $__oomf ]] || return 0
  while read -r k v; do [[ $k == oom_kill ]] && __oom=$v; done <"$__oomf"
}

__make_room() {  # before the driver forks: if the user's processes hold the pids limit, kill them all
  local cur i
  [[ -n $__pidsf && $__pidsmax =~ ^[0-9]+$ ]] || return 0
  read -r cur <"$__pidsf" 2>/dev/null || return 0
  (( cur + 4 < __pidsmax )) && return 0
  # A fork here would stall in bash's fork retry (15 s) and then end the driver, so nothing of the
  # user's survives: the command's group first (like a timeout), then every other process of the uid.
  __kill_ush
  for (( i = 0; i < 100; i++ )); do kill -KILL -1 2>/dev/null; __survivors || break; __nap 0.01; done
  __st=pids_exhausted
}

__nap() { read -t "$1" -u "$__zz" __ignored; }  # sleep without a fork: nothing ever writes there

__ensure_ush() {
  if [[ -n $__ush_pid ]]; then kill -0 "$__ush_pid" 2>/dev/null && return 0; wait "$__ush_pid" 2>/dev/null; fi
  __make_room
  local src=$__restore
  [[ -r $__ctl/state.env ]] && src=$__ctl
  if [[ -n $src && -r $src/state.env ]]; then  # start empty so variables the user unset stay unset
    env -i setsid nice -n 19 bash --noprofile --norc -c "$__ush_src" crucible-shell "$__ctl" "$__out" "$src" \
      <"$__ctl/cmd.fifo" >"$__ctl/rc.fifo" 2>/dev/null {__cmdw}>&- {__rcr}<&- {__zz}<&- &
  else
    setsid nice -n 19 bash --noprofile --norc -c "$__ush_src" crucible-shell "$__ctl" "$__out" "" \
      <"$__ctl/cmd.fifo" >"$__ctl/rc.fifo" 2>/dev/null {__cmdw}>&- {__rcr}<&- {__zz}<&- &
  fi
  __ush_pid=$!
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
}

__wait_rc() {  # $1 seq, $2 timeout ms -> __rc, __st
  # `read -t` reads a pipe a byte at a time, and when its timer fires mid-line it has already consumed
  # the bytes it read: it returns them in the variable and fails. They are kept in `part` and the line
  # is completed by the next read; dropping them would turn "12 0" into " 0", a reply that never
  # matches, and a finished command would then wait out its whole deadline and be reported as timeout.
  local deadline=$(( ${EPOCHREALTIME/./} + $2 * 1000 )) left s line part=
  while :; do
    left=$(( deadline - ${EPOCHREALTIME/./} ))
    if (( left <= 0 )); then __kill_ush; __rc=124; __st=timeout; return; fi
    (( left > 250000 )) && left=250000
    printf -v s '%d.%06d' $(( left / 1000000 )) $(( left % 1000000 ))
    line=
    if IFS= read -r -t "$s" -u "$__rcr" line; then
      line=$part$line part=
      [[ $line == "$1 "* ]] && { __rc=${line#"$1 "}; __st=ok; return; }
    elif part+=$line; ! kill -0 "$__ush_pid" 2>/dev/null; then
      wait "$__ush_pid" 2>/dev/null; __rc=$?; __st=exited; __ush_pid=; return
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

__survivors() {  # any other process of this uid left? (`kill -0 -1` cannot tell: it ignores EPERM)
  local p
  for p in /proc/[0-9]*; do [[ $p != "/proc/$$" && -O $p ]] && return 0; done
  return 1
}

__pad() { local i; for (( i = 0; i < $1; i++ )); do printf ' '; done; }  # keep the framing if head failed

__step() {
  local t0=${EPOCHREALTIME/./} f=$__out/$__seq oom0
  (( ++__steps % 256 == 0 )) && rm -f -- "$__out"/* 2>/dev/null
  printf '%s' "$__payload" >"$__ctl/cmd" || { __reply 126 control_full "" "$t0"; return; }
  __ensure_ush
  __read_oom; oom0=$__oom
  printf '%s\n' "$__seq" >&"$__cmdw"
  __wait_rc "$__seq" "$__arg"
  __read_oom; (( __oom > oom0 )) && __st=oom
  __make_room
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$__nonce" "$__seq" "$t0" "$(( ${EPOCHREALTIME/./} - t0 ))" "$__rc" "$__st" \
    >>"$__hist/index.tsv" 2>/dev/null
  printf '%s' "${__payload:0:65536}" >"$__hist/$__nonce-$__seq.cmd" 2>/dev/null
  __reply "$__rc" "$__st" "$f" "$t0"
}

__reset() {  # kill every other process of this user, then run the payload script
  local t0=${EPOCHREALTIME/./} f=$__out/$__seq i
  kill -KILL -1 2>/dev/null
  [[ -n $__ush_pid ]] && wait "$__ush_pid" 2>/dev/null  # reap it: a zombie child still counts
  __ush_pid= __restore=
  for (( i = 0; i < 200; i++ )); do  # forks racing the first kill (a fork bomb) need more rounds
    __survivors || break
    kill -KILL -1 2>/dev/null
    __nap 0.01
  done
  if __survivors; then __reply 125 busy "" "$t0"; return; fi
  # A subshell, not `bash -c`: no exec on the reset path. The host's deadline bounds it; a reset that
  # overruns fails and the sandbox is destroyed.
  ( set -- "$__ctl" "$__out"; eval "$__payload" ) </dev/null >"$f" 2>&1 {__cmdw}>&- {__rcr}<&- {__zz}<&-
  __reply $? ok "$f" "$t0"
}

__seq=0
__reply 0 ready "" "${EPOCHREALTIME/./}"
while IFS=' ' LC_ALL=C read -r __op __seq __arg __len; do
  __payload=
  if (( __len > 0 )); then LC_ALL=C read -r -N "$__len" __payload || break; fi
  case $__op in
    x) __step ;;
    r) __reset ;;
    l) printf '%s\n' "$__payload" >"$__root/lease" 2>/dev/null; __reply $? ok "" "${EPOCHREALTIME/./}" ;;
    p) __reply 0 ok "" "${EPOCHREALTIME/./}" ;;
    q) break ;;
    *) __reply 2 bad_request "" "${EPOCHREALTIME/./}" ;;
  esac
done
[[ -n $__ush_pid ]] && { kill -KILL -- "-$__ush_pid" 2>/dev/null; wait "$__ush_pid" 2>/dev/null; }
exit 0
"""
