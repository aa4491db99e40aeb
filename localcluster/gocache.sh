# Sourced by the scripts that build Go binaries (cluster.sh, registry.sh, prometheus.sh, images/build.sh); they set
# DDP_CACHE first.
#
# go_compiler_memory: the compiler (a Go program) collects garbage less often, within a bound per
# process: GOGC=400 took a fifth less CPU than Go's default of 100 to build etcd (74 -> 60 s of CPU,
# 48 -> 42 s on 2 cores, EPYC VM, 2026-11-29), and GOMEMLIMIT keeps each compile of the largest
# Kubernetes packages within 3 GiB. Values set in the environment win.
go_compiler_memory() {
  export GOGC=${GOGC:-400} GOMEMLIMIT=${GOMEMLIMIT:-3GiB}
}

# go_cache_scope COMMAND...: runs COMMAND in a subshell whose Go build cache is a folder of its own,
# $DDP_CACHE/go-build.<pid>, removed when COMMAND ends. Every binary is kept in $DDP_CACHE/bin, so a
# kept compiler cache would only hold disk: over 10 GB once the control plane and node are built,
# which the images need on a fresh machine. A GOCACHE set in the environment is used and kept instead
# (for working on the Go patches, where rebuilds come often).
go_cache_scope() {
  go_compiler_memory
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

# go_build_into BIN MODULE_DIR PACKAGE GO_BUILD_ARGS...: builds PACKAGE from the pinned go.mod in MODULE_DIR
# into the folder BIN, static (no cgo), with a build cache of its own; a folder BIN another build made in
# the meantime is kept. The caller checks BIN's binary afterwards and says what failed.
go_build_into() {
  local bin=$1 dir=$2 package=$3
  shift 3
  local tmp="$bin.tmp.$$"
  rm -rf "$tmp" && mkdir -p "$tmp"
  (cd "$dir" && CGO_ENABLED=0 go_cache_scope nice go build -trimpath "$@" -o "$tmp/" "$package") || { rm -rf "$tmp"; return 1; }
  mv -T "$tmp" "$bin" 2>/dev/null || rm -rf "$tmp"  # another build may have got there first
}

# built_once OUT COMMAND...: runs COMMAND, which makes the folder OUT, unless OUT is there; one such
# build of OUT at a time on the machine, so that a build started beside another one making the same
# OUT (the node's runc and the images' runc, two clones' first builds) waits for it and uses its result.
built_once() {
  local out=$1
  shift
  [ -e "$out" ] && return 0
  mkdir -p "$(dirname "$out")"
  (
    flock 9
    [ -e "$out" ] || "$@"
  ) 9>"$(dirname "$out")/.$(basename "$out").lock"
}
