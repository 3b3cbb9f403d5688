"""Where things live inside a sandbox, and the tmpfs mounts that make them writable.

The root filesystem is read-only; every writable place is a size-limited tmpfs (overlay2 on ext4 has
no per-container disk quota). tmpfs pages are charged to the container's memory cgroup.

    /workspace (spec.workdir)   the agent's files            agent-owned, exec, spec.workspace_size
    /tmp                        scratch                      1777, exec, spec.tmp_size
    /home/agent (spec.home)     HOME                         agent-owned, spec.home_size
    /run/crucible               the driver's fifos, history, lease, bash copy   root-owned 0711, exec
    /run/crucible-out           one command's raw output before capping   root-owned 0711, spec.capture_size
    /run/crucible-pristine      baseline copy of .git config/hooks/refs   keeper-owned: agent cannot edit
    /run/crucible-keeper        the keeper's scratch: a browser sandbox's Chromium profile   keeper-owned 0700
    /dev/shm/.crucible-shell-*  the user shell's cwd/env checkpoint       the agent's own (see driver.py)

The shell driver runs as root (CONTROL_USER) with only CONTROL_CAPS; see driver.py for why.
"""

from __future__ import annotations

from sandboxes.spec import SandboxSpec

CONTROL_DIR = "/run/crucible"
CAPTURE_DIR = "/run/crucible-out"
PRISTINE_DIR = "/run/crucible-pristine"
KEEPER_DIR = "/run/crucible-keeper"
"""The keeper's own scratch (a browser sandbox's Chromium profile and cache): out of the agent's reach,
and out of the reset's, which empties /tmp and would fail on files it cannot remove."""
LEASE_FILE = f"{CONTROL_DIR}/lease"
HISTORY_DIR = f"{CONTROL_DIR}/history"
SHELL_STATE_PREFIX = "/dev/shm/.crucible-shell"
# The driver owns the control channel as root, with the three capabilities it needs to start the user
# shell as the agent (setpriv: SETUID, SETGID) and to stop the agent's processes (KILL). The agent's
# processes never hold any capability: they are not root, and no-new-privileges plus nosuid mounts
# keep them from gaining one. Docker adds these to the bounding set only; a non-root exec gets none.
CONTROL_USER = "0:0"
CONTROL_CAPS = ("SETUID", "SETGID", "KILL")
# What a process of ours that is not the agent's starts with. The container's environment comes from
# the image and the environment spec, and its PATH may name the agent's own directories (a venv in
# /workspace, say): a root or keeper process that searched it, or honoured LD_PRELOAD or BASH_ENV,
# would run the agent's files with our privileges. So: an empty environment, a PATH on the read-only
# root filesystem, and an absolute argv[0] so that not even the engine searches the container's PATH.
SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # the image's own: read-only


def privileged_argv(argv: list[str] | tuple[str, ...]) -> list[str]:
    """`argv` for a control or keeper exec: run with a clean environment and a safe PATH."""
    return ["/usr/bin/env", "-i", f"PATH={SAFE_PATH}", "LANG=C.UTF-8", *argv]


def is_privileged(user: str) -> bool:
    return user in (CONTROL_USER, KEEPER_USER)
# Owner of the pristine git baseline (written by a keeper exec, read by the agent's reset script):
# an unprivileged uid that is not the agent's, so the agent cannot change the baseline.
KEEPER_USER = "65534:65534"
CONTROL_SIZE = 16 << 20
PRISTINE_SIZE = 16 << 20
KEEPER_SIZE = 512 << 20  # tmpfs pages count against the container's memory only once written
SHM_SIZE = 64 << 20


def tmpfs_mounts(spec: SandboxSpec) -> dict[str, str]:
    """Docker `tmpfs=` mapping for a spec (nosuid,nodev everywhere; exec where agents run code)."""
    uid, gid = spec.user.split(":")
    keeper_uid, keeper_gid = KEEPER_USER.split(":")
    agent = f"uid={uid},gid={gid},mode=0755,nosuid,nodev"
    return {
        spec.workdir: f"size={spec.workspace_size},{agent},exec",
        spec.home: f"size={spec.home_size},{agent},exec",
        "/tmp": f"size={spec.tmp_size},mode=1777,nosuid,nodev,exec",
        # exec: the driver's unreadable copy of bash runs from here (only root can write the mount).
        CONTROL_DIR: f"size={CONTROL_SIZE},uid=0,gid=0,mode=0711,nosuid,nodev,exec",
        CAPTURE_DIR: f"size={spec.capture_size},uid=0,gid=0,mode=0711,nosuid,nodev,noexec",
        PRISTINE_DIR: f"size={PRISTINE_SIZE},uid={keeper_uid},gid={keeper_gid},mode=0755,nosuid,nodev,noexec",
        KEEPER_DIR: f"size={KEEPER_SIZE},uid={keeper_uid},gid={keeper_gid},mode=0700,nosuid,nodev,noexec",
        # Hidden: an empty, read-only tmpfs over the image's directory; what the image holds there is out of reach.
        **{path: "size=4k,uid=0,gid=0,mode=0555,ro,nosuid,nodev,noexec" for path in spec.masked_paths},
    }


def sandbox_env(spec: SandboxSpec) -> dict[str, str]:
    """Environment of every process we start: HOME/USER/LANG defaults, then the spec's own variables."""
    env = {
        "HOME": spec.home,
        "USER": "agent",
        "LANG": "C.UTF-8",
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "TERM": "dumb",
        "PAGER": "cat",
        "GIT_PAGER": "cat",
    }
    env.update(spec.env_dict)
    return env
