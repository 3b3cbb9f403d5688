# shellcheck shell=bash
# The agent's shell: reads a step's command from a file, runs it, checkpoints cwd and exports.
echo 500 >/proc/self/oom_score_adj 2>/dev/null  # under memory pressure the kernel kills agent code first
__crucible_out=$1 __crucible_state=$2 __crucible_src=$3 __crucible_base=$4
[[ -r $__crucible_state.env ]] && __crucible_src=$__crucible_state  # our own checkpoint first
if [[ -n $__crucible_src && -r $__crucible_src.env ]]; then  # started empty: unset variables stay unset
  # shellcheck disable=SC1090  # the checkpoint this shell wrote (`export -p`), its path known only at run time
  . "$__crucible_src.env" 2>/dev/null
  if [[ -r $__crucible_src.cwd ]] && IFS= read -r __crucible_d <"$__crucible_src.cwd"; then
    # shellcheck disable=SC2164  # a directory gone since the checkpoint: the shell stays where it starts
    cd -- "$__crucible_d" 2>/dev/null
  fi
else
  eval "$__crucible_base"  # the container's environment (HOME, PATH, the spec's variables)
fi
unset __crucible_src __crucible_d __crucible_base
# `builtin`: a user function named read/eval/printf/pwd/export must not hijack the loop.
while IFS=' ' builtin read -r __crucible_seq __crucible_tok; do
  IFS= builtin read -r -d '' __crucible_cmd <"$__crucible_out/cmd"  # a file: read in blocks, not bytes
  { builtin eval "$__crucible_cmd"$'\n'; } </dev/null >>"$__crucible_out/$__crucible_tok" 2>&1
  __crucible_rc=$?
  builtin pwd >"$__crucible_state.cwd" 2>/dev/null
  builtin export -p >"$__crucible_state.env" 2>/dev/null
  builtin printf '%s %s %s\n' "$__crucible_seq" "$__crucible_tok" "$__crucible_rc"
done
