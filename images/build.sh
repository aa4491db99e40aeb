#!/usr/bin/env bash
# Builds the images in images/ without Docker: BuildKit's buildkitd (its OCI worker, running steps
# with runc) and buildctl, both built from their Go modules, from the Dockerfiles exactly as Docker
# would read them.
#
# Usage: images/build.sh build       build every image (unchanged ones are not rebuilt), then load
#                                     them into the local node's containerd if it is up
#        images/build.sh tarball NAME print the path of image NAME's tarball (building it if needed)
#        images/build.sh push REGISTRY [CA]
#                                     build every image as `build` does, then push each to
#                                     REGISTRY/ddp-operator/NAME:<tag> (REGISTRY: host[:port][/path]) with
#                                     the credentials of the Docker config (DOCKER_CONFIG, else
#                                     ~/.docker/config.json, as `docker login` writes it) and CA, a PEM
#                                     file, trusted for that registry; nothing is loaded into the node.
#                                     Layers are zstd; PUSH_COMPRESSION=gzip for clients older than
#                                     containerd 1.5 and Docker 23
#        images/build.sh probe NAME DIR
#                                     build DIR/Dockerfile, in which the image NAME is available as
#                                     ddp-operator/NAME:<tag>, and export its result into DIR/out
#        images/build.sh derived NAME DIR
#                                     build DIR/Dockerfile (FROM ddp-operator/trainer:<tag>, as a user
#                                     builds on it) into ddp-operator/NAME:<tag>, load it into the local
#                                     node if it is up, and print its tarball's path
#
# No registry is reachable here, so the base the Dockerfiles name (python:3.11-slim) is made from
# Debian's packages (make_base) and handed to BuildKit as a named build context from an OCI layout
# on disk: the Dockerfile frontend replaces any FROM of that name with it, so the same Dockerfiles
# build unchanged with Docker elsewhere.
#
# Everything is cached outside the clone under $DDP_CACHE: binaries in bin/<name>-<version>,
# buildkitd's state (layers and the pip cache the Dockerfiles mount) in buildkit/, the base and the
# image tarballs in images/, each keyed by a hash of its inputs. buildkitd listens on a unix socket
# only, runs for one command and is stopped when the command ends.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$HERE")

# Pinned versions. BuildKit's must match localcluster/go/buildkit/go.mod.
BUILDKIT_VERSION=v0.34.2
RUNC_VERSION=v1.5.2
DEBIAN_SUITE=bookworm

DDP_CACHE=${DDP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ddp-operator}
BIN_BUILDKIT=$DDP_CACHE/bin/buildkit-$BUILDKIT_VERSION
BIN_RUNC=$DDP_CACHE/bin/runc-$RUNC_VERSION
BUILDKIT_STATE=$DDP_CACHE/buildkit
IMAGE_CACHE=$DDP_CACHE/images
CLUSTER=$REPO/localcluster/cluster.sh
# BuildKit's cache is pruned to this many MB after each command, least recently used first: it holds
# the trainer's layers (about 5.5 GB unpacked, 2.7 GB compressed) and the pip wheelhouse (3.5 GB).
BUILDKIT_CACHE_MB=${DDP_BUILDKIT_CACHE_MB:-16000}
# Tarballs kept per image (the newest), so that clones with different sources do not rebuild in turn.
KEEP_TARBALLS=2

# The one base image made here, under the name the Dockerfiles use.
BASE_IMAGE=python:3.11-slim
# The images: NAME -> Dockerfile, and the build arguments of the variant built here.
declare -A DOCKERFILE=([operator]=images/operator/Dockerfile [trainer]=images/trainer/Dockerfile)
# The trainer's CPU variant: its default base is a CUDA pytorch image, which needs a registry.
declare -A BUILD_ARGS=([operator]="" [trainer]="BASE=$BASE_IMAGE")
IMAGES=(operator trainer)
# Images are tagged with the chart's appVersion, which the chart deploys by default.
TAG=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\} *$/\1/p' "$REPO/charts/Chart.yaml")
REPOSITORY=ddp-operator
# Layers are zstd-compressed: gzip took 3.5 min for the trainer's 5 GB torch layer on 2 cores, zstd
# 45 s; containerd (the node) and Docker 23 or later load zstd layers.
EXPORT="type=docker,compression=zstd,force-compression=true"
# Pushed layers are zstd, as the tarball's are, so the push uploads the built blobs without compressing
# them again (gzip took 3.5 min for the trainer's layers on 2 cores) and nodes unpack them faster: every
# node of the Kubernetes releases the chart supports (containerd 1.6 or later, CRI-O) and Docker 23 or
# later pull them. PUSH_COMPRESSION=gzip is for older clients; BuildKit keeps the gzip blobs in its cache.
PUSH_COMPRESSION=${PUSH_COMPRESSION:-zstd}
PUSH_REGISTRY=""  # host[:port][/path] for `push`
PUSH_CA=""        # a PEM file of the CA that registry's certificate chains to, if not a public one

export GOTOOLCHAIN=local
source "$REPO/localcluster/gocache.sh"

exec 3>&2  # messages go here even from inside commands whose own output is captured
log() { printf '[images] %s\n' "$*" >&3; }
die() { printf '[images] error: %s\n' "$*" >&3; exit 1; }

# --- host tools --------------------------------------------------------------

# need_debs PACKAGE...: installs the Debian packages that are missing (this machine is Debian).
need_debs() {
  "$REPO/scripts/apt-install.sh" "$@" 2>&3 || die "could not install the Debian packages $*"
}

# into_place TMP OUT: renames a finished build folder into its cache entry; if another build
# (the node's set-up builds runc too) got there first, theirs is kept.
into_place() {
  mv -T "$1" "$2" 2>/dev/null || rm -rf "$1"
  [ -d "$2" ] || die "could not create $2"
}

# build_buildkit: buildkitd and buildctl from the wrapper module localcluster/go/buildkit
# (BuildKit's own go.mod has exclude directives, so `go install` refuses it).
build_buildkit() {
  [ -x "$BIN_BUILDKIT/buildkitd" ] && return 0
  command -v go >/dev/null || die "go is not installed; BuildKit is built from its Go module"
  local tmp="$BIN_BUILDKIT.tmp.$$" pkg=github.com/moby/buildkit
  rm -rf "$tmp" && mkdir -p "$tmp"
  log "building BuildKit $BUILDKIT_VERSION (cached afterwards in $BIN_BUILDKIT)"
  (cd "$REPO/localcluster/go/buildkit" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath \
    -tags "osusergo netgo static_build seccomp" \
    -ldflags "-s -w -X $pkg/version.Version=$BUILDKIT_VERSION -X $pkg/version.Package=$pkg" \
    -o "$tmp/" $pkg/cmd/buildkitd $pkg/cmd/buildctl)
  into_place "$tmp" "$BIN_BUILDKIT"
}

# build_runc: runc with cgo and seccomp (libseccomp-dev), or every container fails on the default
# seccomp profile; built the same way, at the same path, as the node's runc.
build_runc() {
  [ -x "$BIN_RUNC/runc" ] && return 0
  command -v go >/dev/null || die "go is not installed; runc is built from its Go module"
  command -v gcc >/dev/null || die "gcc is not installed; runc needs cgo"
  need_debs libseccomp-dev
  local tmp="$BIN_RUNC.tmp.$$"
  rm -rf "$tmp" && mkdir -p "$tmp"
  log "building runc $RUNC_VERSION (cached afterwards in $BIN_RUNC)"
  CGO_ENABLED=1 GOFLAGS='' GOBIN=$tmp go install -trimpath -tags seccomp -ldflags "-s -w" \
    "github.com/opencontainers/runc@$RUNC_VERSION"
  into_place "$tmp" "$BIN_RUNC"
}

# --- the base image ----------------------------------------------------------

# base_rootfs TAR: a Debian rootfs like python:3.11-slim's: Debian's python3 (3.11 in bookworm) with
# pip and `python` on PATH, pip allowed to install system-wide (no EXTERNALLY-MANAGED marker, as in
# python:3.11-slim), the host's CA bundle (pip in RUN steps trusts what the host trusts), no docs,
# man pages or locales, and no /dev entries (the runtime makes them).
base_rootfs() {
  need_debs mmdebstrap
  # shellcheck disable=SC2016  # the hooks' $1 (the rootfs) is mmdebstrap's to expand
  mmdebstrap --quiet --mode=root --variant=apt --include=python3,python3-pip,python-is-python3 \
    --aptopt='APT::Install-Recommends "false"' \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --customize-hook='mkdir -p "$1/etc/ssl/certs" && cp /etc/ssl/certs/ca-certificates.crt "$1/etc/ssl/certs/"' \
    --customize-hook='rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED' \
    --customize-hook='chroot "$1" python -m pip --version >&2' \
    "$DEBIAN_SUITE" - | mmtarfilter --path-exclude='/dev/*' >"$1"
}

# base_key: what the base is made of: this recipe and the host's CA bundle.
base_key() {
  { declare -f base_rootfs; cat /etc/ssl/certs/ca-certificates.crt; echo "$DEBIAN_SUITE $BASE_IMAGE"; } |
    sha256sum | cut -c1-16
}

# blob LAYOUT FILE: moves FILE into the OCI layout's blobs and prints its digest (sha256:...).
blob() {
  local sum
  sum=$(sha256sum "$2" | cut -d' ' -f1)
  mkdir -p "$1/blobs/sha256"
  mv "$2" "$1/blobs/sha256/$sum"
  echo "sha256:$sum"
}

# descriptor MEDIATYPE LAYOUT DIGEST: the OCI descriptor of a blob.
descriptor() {
  printf '{"mediaType":"%s","digest":"%s","size":%s}' "$1" "$3" "$(stat -c %s "$2/blobs/sha256/${3#sha256:}")"
}

# base_layout DIR: the base as an OCI image layout (one layer, the rootfs).
base_layout() {
  local dir=$1 tmp=$1/tmp diff_id layer config manifest arch
  mkdir -p "$tmp"
  log "making $BASE_IMAGE from Debian $DEBIAN_SUITE with mmdebstrap"
  base_rootfs "$tmp/rootfs.tar"
  diff_id=sha256:$(sha256sum "$tmp/rootfs.tar" | cut -d' ' -f1)
  gzip -n "$tmp/rootfs.tar"
  layer=$(blob "$dir" "$tmp/rootfs.tar.gz")
  arch=$(dpkg --print-architecture)
  printf '{"architecture":"%s","os":"linux","config":{"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin","LANG=C.UTF-8"],"Cmd":["python3"]},"rootfs":{"type":"layers","diff_ids":["%s"]},"history":[{"created_by":"mmdebstrap %s python3 python3-pip python-is-python3 (images/build.sh)"}]}' \
    "$arch" "$diff_id" "$DEBIAN_SUITE" >"$tmp/config.json"
  config=$(blob "$dir" "$tmp/config.json")
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":%s,"layers":[%s]}' \
    "$(descriptor application/vnd.oci.image.config.v1+json "$dir" "$config")" \
    "$(descriptor application/vnd.oci.image.layer.v1.tar+gzip "$dir" "$layer")" >"$tmp/manifest.json"
  manifest=$(blob "$dir" "$tmp/manifest.json")
  printf '{"schemaVersion":2,"manifests":[%s]}' \
    "$(descriptor application/vnd.oci.image.manifest.v1+json "$dir" "$manifest" |
      sed "s|}\$|,\"annotations\":{\"org.opencontainers.image.ref.name\":\"${BASE_IMAGE#*:}\"},\"platform\":{\"architecture\":\"$arch\",\"os\":\"linux\"}}|")" \
    >"$dir/index.json"
  echo '{"imageLayoutVersion":"1.0.0"}' >"$dir/oci-layout"
  rmdir "$tmp"
}

# make_base: the base's OCI layout, made once per recipe; prints its folder.
make_base() {
  local dir
  dir=$IMAGE_CACHE/base-$(base_key)
  if [ ! -f "$dir/index.json" ]; then
    local tmp="$dir.tmp.$$"
    rm -rf "$tmp" && mkdir -p "$tmp"
    base_layout "$tmp"
    into_place "$tmp" "$dir"
  fi
  echo "$dir"
}

# manifest_digest LAYOUT: the digest of the (only) image in an OCI layout.
manifest_digest() {
  sed -n 's/.*"digest":"\(sha256:[0-9a-f]*\)".*/\1/p' "$1/index.json" | head -1
}

# --- buildkitd ---------------------------------------------------------------

BUILDKIT_RUN=""  # the running buildkitd's folder (socket, config, pid, log)

# start_buildkitd: a buildkitd for this command: the OCI worker on our runc, host network (RUN steps
# reach PyPI; nothing is served), a unix socket in a private folder; stopped on exit.
start_buildkitd() {
  mkdir -p "$BUILDKIT_STATE"
  # One buildkitd at a time owns the state; a second command waits for the first.
  exec 9>"$BUILDKIT_STATE.lock"
  flock -n 9 || { log "waiting for another images/build.sh to finish with $BUILDKIT_STATE"; flock 9; }
  BUILDKIT_RUN=$(mktemp -d /tmp/ddp-buildkit.XXXXXX)
  trap stop_buildkitd EXIT
  trap 'exit 130' INT TERM
  cat >"$BUILDKIT_RUN/buildkitd.toml" <<EOF
[otel]
  socketPath = "$BUILDKIT_RUN/otel.sock"
[history]
  maxEntries = 10
[worker.oci]
  # This buildkitd lives for one command, too short for its own GC: stop_buildkitd prunes instead.
  gc = false
EOF
  # buildkitd itself pushes (buildctl only hands it the credentials), so it is the one to trust the CA.
  if [ -n "$PUSH_CA" ]; then
    printf '[registry."%s"]\n  ca = ["%s"]\n' "${PUSH_REGISTRY%%/*}" "$PUSH_CA" >>"$BUILDKIT_RUN/buildkitd.toml"
  fi
  setsid "$BIN_BUILDKIT/buildkitd" --config "$BUILDKIT_RUN/buildkitd.toml" --root "$BUILDKIT_STATE" \
    --addr "unix://$BUILDKIT_RUN/buildkitd.sock" --containerd-worker=false --oci-worker=true \
    --oci-worker-binary "$BIN_RUNC/runc" --oci-worker-net host \
    >"$BUILDKIT_RUN/buildkitd.log" 2>&1 </dev/null 3>&- &
  echo $! >"$BUILDKIT_RUN/pid"
  # Should this script be killed outright (no EXIT trap), the watchdog stops the build and buildkitd.
  setsid bash -c "$(declare -f stop_build); while kill -0 \$1 2>/dev/null; do sleep 1; done; stop_build \$2; rm -rf \$2" \
    watchdog $$ "$BUILDKIT_RUN" >/dev/null 2>&1 </dev/null 3>&- 9>&- &
  echo $! >"$BUILDKIT_RUN/watchdog.pid"
  local deadline=$((SECONDS + 60))
  until buildctl debug workers >/dev/null 2>&1; do
    if ! kill -0 "$(cat "$BUILDKIT_RUN/pid")" 2>/dev/null; then
      tail -5 "$BUILDKIT_RUN/buildkitd.log" >&3
      die "buildkitd exited during start (state $BUILDKIT_STATE)"
    fi
    [ $SECONDS -lt $deadline ] || die "buildkitd not ready after 60 s; see $BUILDKIT_RUN/buildkitd.log"
    sleep 0.2
  done
}

# stop_build RUN: cancels the build in progress (its buildctl) and stops the buildkitd whose folder
# is RUN, waiting until both are gone (buildkitd lets running steps finish unless killed).
stop_build() {
  local pid
  for pid in $(cat "$1/buildctl.pid" "$1/pid" 2>/dev/null); do
    kill -TERM "$pid" 2>/dev/null || continue
    for _ in $(seq 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  done
}

# stop_buildkitd: prunes BuildKit's cache, stops buildkitd, and checks it left no mount behind.
stop_buildkitd() {
  [ -n "$BUILDKIT_RUN" ] || return 0
  kill -TERM "$(cat "$BUILDKIT_RUN/watchdog.pid")" 2>/dev/null || true
  if ! kill -0 "$(cat "$BUILDKIT_RUN/buildctl.pid" 2>/dev/null)" 2>/dev/null; then
    buildctl prune --keep-storage "$BUILDKIT_CACHE_MB" >/dev/null 2>&1 || log "could not prune BuildKit's cache"
  fi
  stop_build "$BUILDKIT_RUN"
  local mount
  for mount in $(awk -v state="$BUILDKIT_STATE/" 'index($2, state) == 1 {print $2}' /proc/mounts | sort -r); do
    log "unmounting $mount, left behind by buildkitd"
    umount "$mount" || umount -l "$mount"
  done
  rm -rf "$BUILDKIT_RUN"
}

# buildctl ARGS...: buildctl against our buildkitd; its pid is kept so that a stop can cancel it.
buildctl() {
  "$BIN_BUILDKIT/buildctl" --addr "unix://$BUILDKIT_RUN/buildkitd.sock" "$@" &
  echo $! >"$BUILDKIT_RUN/buildctl.pid"
  wait $!
}

# --- images ------------------------------------------------------------------

# copied_sources NAME: the paths image NAME's Dockerfile copies from the context (the repo root).
copied_sources() {
  sed -e ':a' -e '/\\$/N; s/\\\n//; ta' "$REPO/${DOCKERFILE[$1]}" |
    awk '$1 == "COPY" { for (i = 2; i < NF; i++) if ($i !~ /^--/) print $i }'
}

# image_key NAME BASE: a hash of what image NAME is made of: its Dockerfile and .dockerignore, the
# files it copies (less what the .dockerignore leaves out), its build arguments, the base and
# BuildKit's version and the export settings.
image_key() {
  local name=$1 dockerfile=$REPO/${DOCKERFILE[$1]} source
  {
    echo "$BUILDKIT_VERSION $EXPORT ${BUILD_ARGS[$name]} $(manifest_digest "$2")"
    cat "$dockerfile" "$dockerfile.dockerignore" 2>/dev/null
    for source in $(copied_sources "$name"); do
      (cd "$REPO" && find "$source" -type f ! -name '*.pyc' ! -path '*/__pycache__/*' -print0 |
        sort -z | xargs -0 sha256sum)
    done
  } | sha256sum | cut -c1-16
}

# check_bases NAME: every FROM of image NAME must be the base made here, or BuildKit would try a registry.
check_bases() {
  local name=$1 arg from
  for from in $(awk '$1 == "FROM" {print $2}' "$REPO/${DOCKERFILE[$name]}"); do
    for arg in ${BUILD_ARGS[$name]}; do from=${from//\$\{${arg%%=*}\}/${arg#*=}}; done
    [ "$from" = "$BASE_IMAGE" ] ||
      die "${DOCKERFILE[$name]}: FROM $from: only $BASE_IMAGE is available here (no registry); see images/build.sh"
  done
}

# build_image NAME BASE OUT: builds image NAME on the base layout BASE into the tarball OUT.
build_image() {
  local name=$1 base=$2 out=$3 dockerfile=$REPO/${DOCKERFILE[$1]} arg args=() started=$SECONDS
  check_bases "$name"
  for arg in ${BUILD_ARGS[$name]}; do args+=(--opt "build-arg:$arg"); done
  log "building $REPOSITORY/$name:$TAG from ${DOCKERFILE[$name]} ${BUILD_ARGS[$name]}"
  buildctl build --progress plain --frontend dockerfile.v0 \
    --local context="$REPO" --local dockerfile="$(dirname "$dockerfile")" --opt filename="$(basename "$dockerfile")" \
    --oci-layout "base=$base" --opt "context:$BASE_IMAGE=oci-layout://base@$(manifest_digest "$base")" \
    "${args[@]}" --output "$EXPORT,name=$REPOSITORY/$name:$TAG,dest=$out.tmp" >"$out.log" 2>&1 ||
    { rm -f "$out.tmp"; tail -20 "$out.log" >&3; die "building $name failed; the whole log is $out.log"; }
  chmod 644 "$out.tmp" && mv "$out.tmp" "$out"
  log "$name: $(du -m "$out" | cut -f1) MB tarball, built in $((SECONDS - started)) s: $out"
}

# image_path NAME BASE: where the tarball of image NAME, as its inputs are now, is kept.
image_path() {
  echo "$IMAGE_CACHE/$1-$(image_key "$1" "$2").tar"
}

# ensure_image NAME BASE TARBALL: builds image NAME unless its tarball exists; older tarballs of
# NAME beyond the newest KEEP_TARBALLS are removed.
ensure_image() {
  if [ -f "$3" ]; then
    touch "$3"
  else
    [ -n "$BUILDKIT_RUN" ] || start_buildkitd
    build_image "$@"
  fi
  local old
  for old in $(ls -t "$IMAGE_CACHE/$1"-*.tar | tail -n +$((KEEP_TARBALLS + 1))); do
    rm -f "$old" "$old.log"
  done
}

# node_up: whether the local node's containerd answers (cluster.sh ctr, once the node exists).
node_up() {
  "$CLUSTER" ctr version >/dev/null 2>&1
}

# tarball_digest TARBALL: the manifest digest of the image in a tarball build_image made.
tarball_digest() {
  tar -xOf "$1" index.json | sed -n 's/.*"digest":"\(sha256:[0-9a-f]*\)".*/\1/p' | head -1
}

# load_into_node NAME TARBALL: imports image NAME into the node's containerd (namespace k8s.io, where
# the kubelet finds it as docker.io/ddp-operator/NAME:<tag>), unless it holds that very image already.
load_into_node() {
  local ref=docker.io/$REPOSITORY/$1:$TAG digest
  digest=$(tarball_digest "$2")
  if "$CLUSTER" ctr images ls "name==$ref" | grep -q "$digest"; then
    log "the node has $ref ($digest) already"
    return 0
  fi
  "$CLUSTER" image-load "$2" "$ref" >&3 || die "ctr could not import $2 into the node's containerd"
  "$CLUSTER" ctr images ls "name==$ref" | grep -q "$digest" || die "the node's containerd has no $ref $digest after importing $2"
  log "loaded $ref ($digest) into the node's containerd"
}

prepare() {
  mkdir -p "$IMAGE_CACHE"
  if [ ! -x "$BIN_RUNC/runc" ] || [ ! -x "$BIN_BUILDKIT/buildkitd" ]; then
    go_cache_scope build_tools
  fi
}

build_tools() {
  built_once "$BIN_RUNC" build_runc
  built_once "$BIN_BUILDKIT" build_buildkit
}

cmd_build() {
  local started=$SECONDS base name tarball tarballs=() i
  prepare
  base=$(make_base)
  for name in "${IMAGES[@]}"; do
    tarball=$(image_path "$name" "$base")
    ensure_image "$name" "$base" "$tarball"
    tarballs+=("$name" "$tarball")
  done
  log "images ready in $((SECONDS - started)) s: ${tarballs[*]}"
  if ! node_up; then
    log "the local node is not up (localcluster/cluster.sh ctr), so the images are only in $IMAGE_CACHE"
    return 0
  fi
  for ((i = 0; i < ${#tarballs[@]}; i += 2)); do load_into_node "${tarballs[i]}" "${tarballs[i + 1]}"; done
}

# known NAME: fails unless NAME is one of the images.
known() {
  [ -n "${DOCKERFILE[$1]:-}" ] || die "no image $1; images: ${IMAGES[*]}"
}

cmd_tarball() {
  local base tarball
  known "$1"
  prepare
  base=$(make_base)
  tarball=$(image_path "$1" "$base")
  ensure_image "$1" "$base" "$tarball"
  echo "$tarball"
}

# image_context NAME TARBALL: the buildctl options (in IMAGE_CONTEXT) under which a Dockerfile's
# `FROM ddp-operator/NAME:<tag>` is the image in TARBALL, unpacked into an OCI layout in buildkitd's
# folder for the command's duration.
image_context() {
  local layout=$BUILDKIT_RUN/image-$1
  rm -rf "$layout" && mkdir "$layout" && tar -xf "$2" -C "$layout"
  IMAGE_CONTEXT=(--oci-layout "image=$layout"
    --opt "context:$REPOSITORY/$1:$TAG=oci-layout://image@$(manifest_digest "$layout")")
}

# cmd_probe NAME DIR: builds DIR/Dockerfile with image NAME as ddp-operator/NAME:<tag> (from its
# tarball); its `probe` stage always runs afresh; the result goes to DIR/out.
cmd_probe() {
  local name=$1 dir=$2 base tarball
  known "$name"
  [ -f "$dir/Dockerfile" ] || die "no Dockerfile in $dir"
  prepare
  base=$(make_base)
  tarball=$(image_path "$name" "$base")
  ensure_image "$name" "$base" "$tarball"
  [ -n "$BUILDKIT_RUN" ] || start_buildkitd
  image_context "$name" "$tarball"
  rm -rf "$dir/out"
  buildctl build --progress plain --frontend dockerfile.v0 --local context="$dir" --local dockerfile="$dir" \
    "${IMAGE_CONTEXT[@]}" --opt no-cache=probe --output "type=local,dest=$dir/out" >"$dir/build.log" 2>&1 ||
    { tail -20 "$dir/build.log" >&3; die "probing $name failed; the whole log is $dir/build.log"; }
}

# derived_key DIR TRAINER: a hash of what an image built FROM the trainer is made of: the trainer image
# (its tarball's manifest digest), DIR's files and the export settings.
derived_key() {
  {
    echo "$BUILDKIT_VERSION $EXPORT $(tarball_digest "$2")"
    (cd "$1" && find . -type f ! -name '*.pyc' ! -path '*/__pycache__/*' -print0 | sort -z | xargs -0 sha256sum)
  } | sha256sum | cut -c1-16
}

# cmd_derived NAME DIR: builds DIR/Dockerfile, whose FROM is the trainer image, into the tarball of
# ddp-operator/NAME:<tag> (unless one of these inputs exists), keeps the newest KEEP_TARBALLS, and loads
# it into the node when the node is up.
cmd_derived() {
  local name=$1 dir base trainer out
  dir=$(cd "$2" && pwd) || die "no folder $2"
  [ -f "$dir/Dockerfile" ] || die "no Dockerfile in $dir"
  [ -z "${DOCKERFILE[$name]:-}" ] || die "$name is one of the project's own images"
  prepare
  base=$(make_base)
  trainer=$(image_path trainer "$base")
  ensure_image trainer "$base" "$trainer"
  out=$IMAGE_CACHE/$name-$(derived_key "$dir" "$trainer").tar
  if [ -f "$out" ]; then
    touch "$out"
  else
    local started=$SECONDS
    [ -n "$BUILDKIT_RUN" ] || start_buildkitd
    image_context trainer "$trainer"
    log "building $REPOSITORY/$name:$TAG from $dir/Dockerfile on $REPOSITORY/trainer:$TAG"
    buildctl build --progress plain --frontend dockerfile.v0 --local context="$dir" --local dockerfile="$dir" \
      "${IMAGE_CONTEXT[@]}" --output "$EXPORT,name=$REPOSITORY/$name:$TAG,dest=$out.tmp" >"$out.log" 2>&1 ||
      { rm -f "$out.tmp"; tail -20 "$out.log" >&3; die "building $name failed; the whole log is $out.log"; }
    chmod 644 "$out.tmp" && mv "$out.tmp" "$out"
    rm -rf "$BUILDKIT_RUN/image-trainer"
    log "$name: $(du -m "$out" | cut -f1) MB tarball, built in $((SECONDS - started)) s: $out"
  fi
  local old
  for old in $(ls -t "$IMAGE_CACHE/$name"-*.tar | tail -n +$((KEEP_TARBALLS + 1))); do
    rm -f "$old" "$old.log"
  done
  if node_up; then
    load_into_node "$name" "$out"
  fi
  echo "$out"
}

# push_image NAME TARBALL: pushes the image in TARBALL (the one `build` loads, so what is pushed is what
# was built and tested, layer for layer) to PUSH_REGISTRY/ddp-operator/NAME:<tag> with BuildKit's own
# push: a Dockerfile of just `FROM` that image, exported to the registry.
push_image() {
  local name=$1 ref=$PUSH_REGISTRY/$REPOSITORY/$1:$TAG dir=$BUILDKIT_RUN/push-$1 auth=() digest started=$SECONDS
  image_context "$name" "$2"
  mkdir -p "$dir" && echo "FROM $REPOSITORY/$name:$TAG" >"$dir/Dockerfile"
  # buildctl fetches registry tokens itself (token-auth registries): it trusts the CA for that too.
  [ -z "$PUSH_CA" ] || auth=(--registry-auth-tlscontext "host=https://${PUSH_REGISTRY%%/*},ca=$PUSH_CA")
  log "pushing $ref (layers as $PUSH_COMPRESSION)"
  buildctl build --progress plain --frontend dockerfile.v0 --local context="$dir" --local dockerfile="$dir" \
    "${IMAGE_CONTEXT[@]}" "${auth[@]}" --metadata-file "$dir/metadata.json" \
    --output "type=image,push=true,compression=$PUSH_COMPRESSION,force-compression=true,name=$ref" \
    >"$dir/push.log" 2>&1 || { tail -20 "$dir/push.log" >&3; die "pushing $ref failed"; }
  digest=$(sed -n 's/.*"containerimage.digest": *"\(sha256:[0-9a-f]*\)".*/\1/p' "$dir/metadata.json")
  [ -n "$digest" ] || die "buildctl reported no digest for $ref (see $dir/metadata.json)"
  log "pushed $ref@$digest in $((SECONDS - started)) s"
  rm -rf "$BUILDKIT_RUN/image-$name"  # the unpacked tarball: gigabytes for the trainer
}

# cmd_push REGISTRY [CA]: builds as cmd_build does and pushes each image instead of loading it into the node.
cmd_push() {
  PUSH_REGISTRY=${1%/}
  case $PUSH_COMPRESSION in zstd | gzip) ;; *) die "PUSH_COMPRESSION must be zstd or gzip, got '$PUSH_COMPRESSION'" ;; esac
  [[ $PUSH_REGISTRY =~ ^[A-Za-z0-9.-]+(:[0-9]+)?(/[a-z0-9._-]+)*$ ]] ||
    die "REGISTRY must look like host[:port][/path] (no scheme), got '$1'"
  if [ -n "${2:-}" ]; then
    [ -f "$2" ] || die "no CA file $2"
    PUSH_CA=$(realpath "$2")
  fi
  local config=${DOCKER_CONFIG:-$HOME/.docker}/config.json base name tarball started=$SECONDS
  [ -f "$config" ] || log "no $config (docker login writes it; DOCKER_CONFIG names its folder): pushing anonymously"
  prepare
  base=$(make_base)
  start_buildkitd
  for name in "${IMAGES[@]}"; do
    tarball=$(image_path "$name" "$base")
    ensure_image "$name" "$base" "$tarball"
    push_image "$name" "$tarball"
  done
  log "pushed ${IMAGES[*]} to $PUSH_REGISTRY in $((SECONDS - started)) s"
}

case "${1:-build}" in
  build) cmd_build ;;
  tarball) [ $# -eq 2 ] || die "usage: $0 tarball NAME"; cmd_tarball "$2" ;;
  push) [ $# -ge 2 ] && [ $# -le 3 ] || die "usage: $0 push REGISTRY [CA]"; cmd_push "$2" "${3:-}" ;;
  probe) [ $# -eq 3 ] || die "usage: $0 probe NAME DIR"; cmd_probe "$2" "$3" ;;
  derived) [ $# -eq 3 ] || die "usage: $0 derived NAME DIR"; cmd_derived "$2" "$3" ;;
  *) echo "usage: $0 [build] | tarball NAME | push REGISTRY [CA] | probe NAME DIR | derived NAME DIR" >&2; exit 2 ;;
esac
