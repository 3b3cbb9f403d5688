"""Where things live inside a sandbox, and the tmpfs mounts that make them writable.

The root filesystem is read-only; every writable place is a size-limited tmpfs (overlay2 on ext4 has
no per-container disk quota). tmpfs pages are charged to the container's memory cgroup.

    /workspace (spec.workdir)   the agent's files            agent-owned, exec, spec.workspace_size
    /tmp                        scratch                      1777, exec, spec.tmp_size
    /home/agent (spec.home)     HOME                         agent-owned, spec.home_size
    /run/crucible               shell control files, history, lease   agent-owned
    /run/crucible-out           one command's raw output before capping  agent-owned, spec.capture_size
    /run/crucible-pristine      baseline copy of .git config/hooks/refs  keeper-owned: agent cannot edit
"""

from __future__ import annotations

from task_workers.sandbox.spec import SandboxSpec

CONTROL_DIR = "/run/crucible"
CAPTURE_DIR = "/run/crucible-out"
PRISTINE_DIR = "/run/crucible-pristine"
LEASE_FILE = f"{CONTROL_DIR}/lease"
HISTORY_DIR = f"{CONTROL_DIR}/history"
# PID 1's `sleep <max_lifetime>` runs as this unprivileged uid, not the agent's: a process can only
# signal its own uid without CAP_KILL (dropped), so the agent can never end the lifetime clock, and
# nothing in the container runs as root.
KEEPER_USER = "65534:65534"
CONTROL_SIZE = 16 << 20
PRISTINE_SIZE = 16 << 20
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
        CONTROL_DIR: f"size={CONTROL_SIZE},{agent},noexec",
        CAPTURE_DIR: f"size={spec.capture_size},{agent},noexec",
        PRISTINE_DIR: f"size={PRISTINE_SIZE},uid={keeper_uid},gid={keeper_gid},mode=0755,nosuid,nodev,noexec",
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
