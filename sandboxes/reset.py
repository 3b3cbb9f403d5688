"""Reset scripts: return a used sandbox to its baseline, verified, or fail so it is replaced.

Repository mode (the workspace was a git repo at creation): restore `.git/config`, hooks, info and
every ref from a baseline copy the agent cannot write (kept by the keeper uid under
/run/crucible-pristine), point HEAD back, `git reset --hard`, `git clean -ffdx`, wipe /tmp, /dev/shm
and HOME, then verify HEAD is the baseline commit and `git status --porcelain --ignored` is empty.
Plain mode: wipe the workspace (re-copy the seed if there is one) and the scratch areas, verify.

Stray processes are killed before the script runs (the driver's `r` op: SIGKILL to every process of
the sandbox user but the one running the script, repeated until none is left). The script runs as
the agent's uid: it only touches the agent's own files, and the driver's files are not its to touch
(the driver empties its history itself). Our own git calls disable hooks and fsmonitor so an edited
repository cannot run code during reset.
"""

from __future__ import annotations

import shlex

from sandboxes.layout import PRISTINE_DIR
from sandboxes.spec import SandboxSpec

PRISTINE_GIT = f"{PRISTINE_DIR}/git"
RESET_TIMEOUT_S = 60.0

_GIT = r"""
export HOME=/nonexistent GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null GIT_TERMINAL_PROMPT=0
g() { git -c safe.directory='*' -c core.hooksPath=/dev/null -c core.fsmonitor=false -c core.untrackedCache=false "$@"; }
fail() { printf 'reset: %s\n' "$*"; exit 1; }
"""

BASELINE_SCRIPT = _GIT + r"""
set -eu
ws=$1 dst=$2
cd "$ws"
rm -rf "$dst"; mkdir -p "$dst"
g rev-parse --verify -q HEAD >"$dst/head_sha"
g symbolic-ref -q HEAD >"$dst/head_ref" || :
g for-each-ref --format='%(objectname) %(refname)' >"$dst/refs"
cp .git/config "$dst/config"
if [ -d .git/hooks ]; then cp -R .git/hooks "$dst/hooks"; else mkdir "$dst/hooks"; fi
if [ -d .git/info ]; then cp -R .git/info "$dst/info"; else mkdir "$dst/info"; fi
cat "$dst/head_sha"
"""

_SCRATCH = r"""
shopt -s dotglob nullglob
junk=(/tmp/* /dev/shm/* "$home"/*)  # /dev/shm holds the user shell's checkpoint too: it starts fresh
for p in "${junk[@]}"; do
  [[ -e $p || -L $p ]] || continue  # only spend a fork on rm when there is something to remove
  rm -rf -- "${junk[@]}" 2>/dev/null || { chmod -R u+rwX -- "${junk[@]}" 2>/dev/null; rm -rf -- "${junk[@]}"; }
  break
done
for d in /tmp /dev/shm "$home"; do left=("$d"/*); (( ${#left[@]} == 0 )) || fail "could not empty $d"; done
"""

_REPO = r"""
cd "$ws" 2>/dev/null || fail "no workspace at $ws"
[[ -d .git ]] || fail "the workspace is no longer a git repository"
IFS= read -r sha <"$pristine/head_sha" || fail "no baseline"
head_ref=; [[ -s $pristine/head_ref ]] && IFS= read -r head_ref <"$pristine/head_ref"
rm -rf .git/hooks .git/info && cp -R "$pristine/config" "$pristine/hooks" "$pristine/info" .git/ \
  || fail "could not restore .git config, hooks and info"
# Refs: compare in bash (no fork) and only call update-ref when something moved.
declare -A want=() have=()
while read -r oid ref; do want[$ref]=$oid; done <"$pristine/refs"
while read -r oid ref; do have[$ref]=$oid; done < <(g for-each-ref --format='%(objectname) %(refname)')
edits=()
for ref in "${!have[@]}"; do [[ -n ${want[$ref]+x} ]] || edits+=("delete $ref"); done
for ref in "${!want[@]}"; do [[ ${have[$ref]-} == "${want[$ref]}" ]] || edits+=("update $ref ${want[$ref]}"); done
if (( ${#edits[@]} )); then printf '%s\n' "${edits[@]}" | g update-ref --stdin || fail "could not restore refs"; fi
IFS= read -r head <.git/HEAD || head=
if [[ -n $head_ref ]]; then
  [[ $head == "ref: $head_ref" ]] || g symbolic-ref HEAD "$head_ref" || fail "could not restore HEAD"
else
  [[ $head == "$sha" ]] || g update-ref --no-deref HEAD "$sha" || fail "could not restore HEAD"
fi
g reset -q --hard "$sha" 2>/dev/null || { rm -f .git/index; g reset -q --hard "$sha"; } || fail "git reset --hard failed"
g clean -q -ffdx || fail "git clean failed"
# One status call verifies both: HEAD is the baseline commit and nothing is modified/untracked/ignored.
mapfile -t status < <(g status --porcelain=v2 --branch --ignored --untracked-files=all)
[[ " ${status[*]} " == *" # branch.oid $sha "* ]] || fail "HEAD is not the baseline commit"
for line in "${status[@]}"; do [[ $line == "# "* ]] || fail "the tree is not clean: $line"; done
echo clean
"""

_PLAIN = r"""
shopt -s dotglob nullglob
entries=("$ws"/*)
if (( ${#entries[@]} )); then
  rm -rf -- "${entries[@]}" 2>/dev/null || { chmod -R u+rwX -- "$ws" 2>/dev/null; rm -rf -- "${entries[@]}"; }
fi
if [[ -n $seed ]]; then cp -R --preserve=mode,timestamps -- "$seed/." "$ws/" || fail "could not copy the seed"
else left=("$ws"/*); (( ${#left[@]} == 0 )) || fail "could not empty $ws"; fi
echo clean
"""


def reset_script(spec: SandboxSpec, *, repo: bool) -> str:
    """The bash program the driver runs, as the agent, for a reset (after driver.RESET_PRELUDE)."""
    params = "\n".join(
        f"{name}={shlex.quote(value)}"
        for name, value in (
            ("ws", spec.workdir),
            ("home", spec.home),
            ("seed", spec.workspace_seed or ""),
            ("pristine", PRISTINE_GIT),
        )
    )
    return "set -u\n" + params + _GIT + _SCRATCH + (_REPO if repo else _PLAIN)


def seed_command(spec: SandboxSpec) -> str:
    """Copy the image's seed directory into the (empty, tmpfs) workspace."""
    assert spec.workspace_seed is not None
    seed, ws = shlex.quote(spec.workspace_seed), shlex.quote(spec.workdir)
    return f"cp -R --preserve=mode,timestamps -- {seed}/. {ws}/ && test -d {ws}/.git && echo repo || echo plain"
