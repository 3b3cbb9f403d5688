r"""The bash programs behind a ShellSession: a driver (protocol + watchdog) and the user's shell, kept as
files in sandboxes/sandbox/ (driver.sh, user_shell.sh, reset_prelude.sh) that `make lint` shellchecks.

Why two shells. Commands must run in ONE long-lived shell so `cd`, `export`, functions and variables
persist, yet each command needs a deadline enforced inside the container. `timeout N bash -c CMD`
would lose that state (a fresh shell per command) and a watchdog that signals the shell running the
command cannot stop a builtin loop (`while :; do :; done`) without killing that shell anyway. So:

* the user shell (`setsid bash`, its own process group, the agent's uid) reads each request from a
  pipe (the command itself from a file the driver writes and it can only read), evals it with stdin from /dev/null and stdout+stderr appended to that step's output file,
  checkpoints `pwd` and `export -p` (builtins only: no fork) and answers `<seq> <token> <rc>`;
* the driver (the process docker exec started, attached to the host socket) reads framed requests,
  hands each command to the user shell, and waits for its answer with `read -t` (a line that a
  read's timer split is reassembled, see __wait_rc). Past the deadline it does what `timeout -k 2 N`
  does to a process group: SIGTERM the group, SIGKILL it 2 s later. A killed or exited user shell is
  restarted from the last checkpoint (cwd and exported variables survive; unexported variables and
  functions do not), and the reply says so.

Who owns the control channel. The driver runs as root inside the container, with only CAP_SETUID,
CAP_SETGID and CAP_KILL (every other capability is dropped, no-new-privileges is set, the root
filesystem is read-only and nothing the agent can run is setuid). Everything the channel needs lives
on root-owned tmpfs the agent cannot write, list or delete:

    /run/crucible            0711  bin/bash (0711: runnable, not readable), lease, history/ (0700),
                                   sessions/<nonce>/ (0700: the command, answer and sleep fifos)
    /run/crucible-out/<n>/   0711  cmd (0644: the current command, for the user shell to read), and one
                                   output file per step, named by a 64-bit random token, created by the
                                   driver (0622) just before the step and emptied right after

The user shell is started as the agent's uid with `setpriv` (no setuid binary) from the 0711 copy of
bash; exec of a file its uid cannot read makes the kernel mark the process non-dumpable, so other
agent processes cannot open its pipes through /proc/<pid>/fd or read its memory. Alternatives we
rejected: a driver that runs as the agent (today's design) cannot keep anything from the agent, since
the agent can write whatever its uid can; keeping the driver as the agent but framing results only on
the attached stream leaves the driver itself killable and ptraceable by the agent. A keeper-uid
driver cannot start a process as another uid without CAP_SETUID, which is the same grant as root's.

What stays the agent's: its own shell. The user shell runs the agent's commands in-process (that is
what makes state persist), so a command can always decide what that shell answers for it — exactly
as it can choose its own exit code. What it cannot do is answer for a LATER command: each request
carries a fresh random token, the answer must quote it, and an answer for the current step with a
wrong token is reported as `control_tampered` (a fault, not `ok`). A command that hands its shell's
saved descriptors to a process it leaves behind has impersonated its own shell; that is the residual
the token narrows to a guess of 64 random bits (it must steal the request to learn the token, and the
shell then never sees the command, which times out). Graders that must not trust the agent's shell
run in a fresh sandbox (code_repo's hidden tests do).

Space is reclaimed every step: a step's output file is emptied once its reply is sent, and the files
of earlier steps are emptied again at every step while they are being written to (a background
process that inherited one keeps writing to it). Before and after each command the driver probes the
capture tmpfs with a one-page write;
if it is full and this step's own output is not what filled it, the step is `capture_full` (a fault).
The driver's own files are bounded (history keeps the last 256 commands per session, 16 KB each); a
failed write there is `control_full` (a fault).

The user shell runs at nice 19 with a raised oom_score_adj, so the driver keeps the CPU it needs to
enforce deadlines under a fork bomb or a spin, and the OOM killer picks agent code first.

The hot path of a step is builtins only (read, printf, eval, pwd, export); a fork happens only when
the command produced output (`stat`, then `head`/`tail` to cap it), so `true` costs well under a
millisecond inside the container.

Host -> driver:  `<op> <seq> <arg> <len>\n` + <len> bytes. ops: x (run; arg = timeout ms),
                 r (reset: kill every process of the agent, then run the payload script as the agent),
                 l (write the lease file), p (ping), q (quit).
Driver -> host:  `\x1e\x1eCRUCIBLE <nonce> <seq> <rc> <status> <size> <head> <tail> <dur_us>\n`
                 + <head> bytes from the start of the output + <tail> bytes from its end.
                 status: ok | timeout | oom | exited (the user shell ended) | pids_exhausted | busy |
                 control_full | capture_full | control_tampered | spawn_failed | bad_request
"""

from __future__ import annotations

from importlib.resources import files


def _program(name: str) -> str:
    """A bash program of sandboxes/sandbox/, as `bash -c` runs it (shellcheck reads the same file)."""
    return files("sandboxes").joinpath("sandbox", name).read_text(encoding="utf-8")


USER_SHELL = _program("user_shell.sh")
"""The agent's shell: `$1` the output dir, `$2` its checkpoint prefix, `$3` a checkpoint to restore, `$4` the
container's environment; runs each step's command and checkpoints cwd and exports after it."""

RESET_PRELUDE = _program("reset_prelude.sh")
"""Run as the agent at the start of a reset: SIGKILL every other process of the agent's uid until none is
left (`kill -1` from root would also hit the keeper's and our own processes), then the reset script."""

DRIVER = _program("driver.sh")
"""The driver (root): the protocol above and the watchdog; its twelve arguments are ShellSession's."""
