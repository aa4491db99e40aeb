# Sourced by the scripts that build Go binaries (cluster.sh, registry.sh, images/build.sh); they set
# DDP_CACHE first.
#
# go_cache_scope COMMAND...: runs COMMAND in a subshell whose Go build cache is a folder of its own,
# $DDP_CACHE/go-build.<pid>, removed when COMMAND ends. Every binary is kept in $DDP_CACHE/bin, so a
# kept compiler cache would only hold disk: over 10 GB once the control plane and node are built,
# which the images need on a fresh machine. A GOCACHE set in the environment is used and kept instead
# (for working on the Go patches, where rebuilds come often).
go_cache_scope() {
  if [ -n "${GOCACHE:-}" ]; then
    "$@"
    return
  fi
  mkdir -p "$DDP_CACHE"
  local left
  for left in "$DDP_CACHE"/go-build.*; do  # a build that was killed leaves its folder
    if [ -d "$left" ] && ! kill -0 "${left##*.}" 2>/dev/null; then rm -rf "$left"; fi
  done
  (
    GOCACHE=$DDP_CACHE/go-build.$BASHPID
    export GOCACHE
    trap 'rm -rf "$GOCACHE"' EXIT
    "$@"
  )
}
