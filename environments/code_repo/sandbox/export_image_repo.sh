# shellcheck shell=bash
# The checked base tree of the repository an image holds, as a tar.gz on stdout (repo.export_image_repo).

set -o pipefail
src=$1 commit=$2 cap=$3 scratch=$4
refuse() { printf '%s\n' "$1" >&2; exit 14; }
export GIT_NO_REPLACE_OBJECTS=1 GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null HOME=/nonexistent GIT_TERMINAL_PROMPT=0
# shellcheck disable=SC2015  # refuse is meant to run when any of the three fails (it exits: no fall-through)
cd "$src" 2>/dev/null && [ -d .git ] && [ ! -L .git ] || refuse "expected a git repository at $src in the image, got none"
[ -e .git/info/grafts ] && refuse "the repository has grafts (.git/info/grafts), which rewrite its history"
for nested in .git/modules .git/worktrees; do
  [ -n "$(ls -A "$nested" 2>/dev/null)" ] && refuse "the repository holds nested repositories ($nested), whose history is not checked"
done
work=$(mktemp -d "$scratch/export.XXXXXX") || exit 20
trap 'rm -rf "$work"' EXIT
# Our own git directory, borrowing the image's objects: the image's config, hooks, attributes, index and
# commit-graph play no part in what is read.
git init -q --bare "$work/git" || exit 20
printf '%s\n' "$src/.git/objects" > "$work/git/objects/info/alternates"
G() { GIT_DIR="$work/git" GIT_INDEX_FILE="$work/index" git -c safe.directory='*' -c core.hooksPath=/dev/null \
      -c core.fsmonitor=false -c core.commitGraph=false -c core.multiPackIndex=false "$@"; }
head=$(git --git-dir="$src/.git" -c safe.directory='*' -c core.fsmonitor=false rev-parse -q --verify 'HEAD^{commit}') \
  || refuse "the repository has no HEAD commit"
# HEAD is the base, or the base with commits that change no file on top (SWE-bench's images commit their
# install step with `git commit --allow-empty -am SWE-bench`): a commit after the base that changes a file
# is the history this check exists to refuse.
if [ "$head" != "$commit" ]; then
  G merge-base --is-ancestor "$commit" "$head" 2>/dev/null || refuse "HEAD is $head, expected the base $commit or a commit on top of it"
  G diff-tree --quiet "$commit" "$head" 2>/dev/null || refuse "HEAD ($head) has commits after the base $commit that change files"
fi
# Every object stored must be in the base's history, and git must read the whole store without complaint:
# a pack without its index, or a stray file where a directory of objects should be, hides objects from a
# listing that still exits 0.
garbage=$(git --git-dir="$src/.git" -c safe.directory='*' count-objects -v 2>&1 | sed -n 's/^garbage: //p')
[ "$garbage" = 0 ] || refuse "its object store holds files that are not objects (garbage: ${garbage:-unreadable})"
G rev-list --objects --no-object-names "$head" 2>"$work/err" > "$work/base.unsorted" \
  || refuse "the base's history cannot be read: $(head -c 300 "$work/err")"
G cat-file --batch-all-objects --batch-check='%(objectname)' 2>>"$work/err" > "$work/all.unsorted" \
  || refuse "its object store cannot be read: $(head -c 300 "$work/err")"
[ -s "$work/err" ] && refuse "git could not read all of its object store: $(head -c 300 "$work/err")"
sort -u "$work/base.unsorted" > "$work/base" && sort -u "$work/all.unsorted" > "$work/all" || exit 20
comm -13 "$work/base" "$work/all" > "$work/beyond" || exit 20
# An annotated tag of a commit in that history (a release before the base) is history too; anything else is not.
: > "$work/extra"
while read -r sha; do
  if [ "$(G cat-file -t "$sha")" = tag ] && target=$(G rev-parse -q --verify "$sha^{}") && grep -qx "$target" "$work/base"; then
    continue
  fi
  printf '%s\n' "$sha" >> "$work/extra"
done < "$work/beyond"
if [ -s "$work/extra" ]; then
  kinds=$(head -200 "$work/extra" | G cat-file --batch-check='%(objecttype)' | sort | uniq -c | tr -s ' \n' ' ')
  refuse "it stores $(wc -l < "$work/extra") objects not in the base's history (${kinds% }), e.g. $(head -1 "$work/extra")"
fi
# The files: the base's, from its objects (the image's working tree and index are not trusted), each one
# hashed again against the base's tree; beside them only what .gitignore covers (build output); no
# repository inside.
nested=$(find . -mindepth 2 -name .git -print -quit 2>/dev/null)
[ -z "$nested" ] || refuse "it holds another repository inside the working tree ($nested)"
mkdir "$work/tree" && G read-tree "$commit" && G --work-tree="$work/tree" checkout-index -a -f || exit 20
G ls-files -s -z > "$work/entries" || exit 20
python3 -I -c "$VERIFY" "$work/tree" < "$work/entries" || refuse "its objects do not hash to their ids (the base's files were altered)"
G --work-tree="$src" ls-files -z --others --exclude-standard > "$work/untracked" || exit 20
if [ -s "$work/untracked" ]; then
  refuse "its working tree holds files neither tracked nor ignored: $(tr '\0' ' ' < "$work/untracked" | head -c 300)"
fi
G --work-tree="$src" ls-files -z --others --ignored --exclude-standard > "$work/ignored" || exit 20
if [ -s "$work/ignored" ]; then tar -C "$src" --null -T "$work/ignored" -cf - | tar -C "$work/tree" -xf - || exit 20; fi
tar -C "$work/tree" --numeric-owner -czf - . | head -c "$cap"
