"""Reset: repositories go back to their baseline, verified clean; anything else fails loudly."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sandboxes import ResetFailed, Sandbox, SandboxBackend, SandboxSpec, create_sandbox

pytestmark = pytest.mark.docker

TAMPER = r"""
echo change >> calc.py && echo new > untracked.txt && mkdir -p __pycache__ && touch __pycache__/x.pyc
git checkout -q -b feature && git commit -qam "agent work" && git tag agent-tag
echo stash-me >> README.md && git stash -q
git checkout -q main && git reset -q --hard HEAD~0 && echo more >> test_calc.py
git config alias.sneaky status && printf '#!/bin/sh\necho hook\n' > .git/hooks/pre-commit
chmod +x .git/hooks/pre-commit && echo '*.log' >> .git/info/exclude
echo scratch > /tmp/scratch && echo dot > ~/.profile && echo shm > /dev/shm/x
nohup sleep 600 >/dev/null 2>&1 &
setsid sleep 600 >/dev/null 2>&1 &
cd /tmp
"""

CHECK = r"""
cd /workspace
git status --porcelain --ignored --untracked-files=all
git for-each-ref --format='%(refname)'
git config --get alias.sneaky || echo no-alias
ls .git/hooks | grep -vc sample
grep -c log .git/info/exclude
ls -A /tmp ~ /dev/shm | grep -v ':$' | grep -c . || true
ps -u agent -o comm= | grep -cx sleep || true
git log --format=%s
pwd
"""


@pytest.fixture(scope="module")
def repo(backend: SandboxBackend, repo_spec: SandboxSpec) -> Iterator[Sandbox]:
    sandbox = create_sandbox(backend=backend, spec=repo_spec)
    yield sandbox
    sandbox.destroy()


def test_seeded_workspace_is_a_repo_with_a_baseline(repo: Sandbox) -> None:
    assert repo.is_repo
    assert repo.step("git status --porcelain && git log --format=%s").stdout == "seed\n"


def test_reset_undoes_everything_an_agent_can_do_and_verifies(repo: Sandbox) -> None:
    done = repo.step(TAMPER)
    assert done.exit_code == 0, done.stdout
    repo.reset()
    lines = repo.step(CHECK).stdout.splitlines()
    assert lines == ["refs/heads/main", "no-alias", "0", "0", "0", "0", "seed", "/workspace"]


def test_reset_is_repeatable(repo: Sandbox) -> None:
    for n in range(3):
        repo.step(f"echo {n} > calc.py && git add -A && git commit -qm n{n}")
        repo.reset()
        assert repo.step("git status --porcelain; git log --format=%s").stdout == "seed\n"


def test_broken_repository_fails_reset(backend: SandboxBackend, repo_spec: SandboxSpec) -> None:
    sandbox = create_sandbox(backend=backend, spec=repo_spec)
    try:
        sandbox.step("rm -rf .git")
        with pytest.raises(ResetFailed, match="no longer a git repository"):
            sandbox.reset()
    finally:
        sandbox.destroy()


def test_plain_workspace_is_wiped(backend: SandboxBackend, base_spec: SandboxSpec) -> None:
    sandbox = create_sandbox(backend=backend, spec=base_spec)
    try:
        sandbox.step("mkdir -p a/b && echo x > a/b/c && echo y > .hidden && chmod 000 a && echo t > /tmp/t")
        sandbox.reset()
        assert sandbox.step("ls -A /workspace /tmp | grep -v ':$' | grep -c .").stdout == "0\n"

        # A repo the caller put in place becomes the baseline once captured.
        sandbox.step("git init -q -b main && echo v1 > f && git add f && git commit -qm base")
        sandbox.capture_baseline()
        sandbox.step("echo v2 > f && git commit -qam later && echo junk > g")
        sandbox.reset()
        assert sandbox.step("cat f; git status --porcelain; git log --format=%s").stdout == "v1\nbase\n"
    finally:
        sandbox.destroy()
