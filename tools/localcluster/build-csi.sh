#!/usr/bin/env bash
# Builds the Kubernetes CSI sidecars the local cluster runs beside its own stand-in driver
# (external-provisioner, external-snapshotter's csi-snapshotter and snapshot-controller) and
# csi-sanity, from their published Go modules at pinned versions, into $WARMSTART_CSI_DIR. It
# also keeps what the driver and the cluster need from those modules: csi.proto (the CSI spec),
# the kubelet's plugin registration proto, and the VolumeSnapshot CRDs. Idempotent.
#
# Their modules carry `replace` directives, so `go install module@version` refuses them: each
# gets a wrapper module that copies those replaces, with a module's own sibling (`=> ./client`)
# pointed at its published version instead.
set -euo pipefail

: "${SNAPSHOTTER_VERSION:?}" "${PROVISIONER_VERSION:?}" "${CSI_TEST_VERSION:?}" "${CSI_SPEC_VERSION:?}" "${KUBELET_API_VERSION:?}" "${WARMSTART_CSI_DIR:?}"
out="$WARMSTART_CSI_DIR"
work="$out.build"
mkdir -p "$out" "$work"
command -v go >/dev/null || { echo "error: Go is required to build the CSI sidecars (https://go.dev/dl)" >&2; exit 2; }
export GOFLAGS="${GOFLAGS:--buildvcs=false}" CGO_ENABLED=0

step() { echo "==> $*"; }
modfield() { go mod download -json "$1" | sed -n "s/^[[:space:]]*\"$2\": \"\(.*\)\",*\$/\1/p"; }

# build_wrapped NAME MODULE VERSION PACKAGE...: one wrapper module, one binary per package.
build_wrapped() {
  local name=$1 module=$2 version=$3
  shift 3
  local missing=0
  for pkg in "$@"; do [ -x "$out/$(basename "$pkg")" ] || missing=1; done
  [ "$missing" = 1 ] || { step "$name $version: cached"; return; }
  local dir="$work/$name"
  rm -rf "$dir" && mkdir -p "$dir" && cd "$dir"
  step "$name $version: resolving module"
  go mod init "warmstart.local/$name" >/dev/null 2>&1
  local gomod
  gomod=$(modfield "$module@$version" GoMod)
  [ -n "$gomod" ] || { echo "error: could not download $module@$version" >&2; exit 3; }
  # `replace A => B V` lines (single or in a block) are copied; `A => ./path` points at A@version.
  sed -n 's/^replace[[:space:]]*//; /=>/p' "$gomod" | { grep -v '^(' || true; } | while read -r from _ to ver; do
    if [[ "$to" == ./* ]]; then go mod edit -replace="$from=$from@$version"
    else go mod edit -replace="$from=$to@$ver"; fi
  done
  go mod edit -require="$module@$version"
  { echo '//go:build tools'; echo 'package tools'; for pkg in "$@"; do echo "import _ \"$pkg\""; done; } > tools.go
  step "$name $version: downloading dependencies"
  go mod tidy >/dev/null 2>"$dir/tidy.log" || { cat "$dir/tidy.log" >&2; exit 3; }
  for pkg in "$@"; do
    local bin
    bin=$(basename "$pkg")
    [ -x "$out/$bin" ] && continue
    step "$name $version: compiling $bin"
    go build -trimpath -ldflags "-s -w -X main.version=$version" -o "$out/$bin.tmp" "$pkg"
    mv "$out/$bin.tmp" "$out/$bin"
  done
}

fetch_files() {
  [ -f "$out/csi.proto" ] && [ -f "$out/pluginregistration.proto" ] && [ -d "$out/crds" ] && { step "protos and CRDs: cached"; return; }
  step "CSI spec $CSI_SPEC_VERSION, kubelet plugin registration $KUBELET_API_VERSION, VolumeSnapshot CRDs"
  local spec kubelet snap
  spec=$(modfield "github.com/container-storage-interface/spec@$CSI_SPEC_VERSION" Dir)
  kubelet=$(modfield "k8s.io/kubelet@$KUBELET_API_VERSION" Dir)
  snap=$(modfield "github.com/kubernetes-csi/external-snapshotter/client/v8@$SNAPSHOTTER_VERSION" Dir)
  cp "$spec/csi.proto" "$out/csi.proto"
  cp "$kubelet/pkg/apis/pluginregistration/v1/api.proto" "$out/pluginregistration.proto"
  rm -rf "$out/crds" && mkdir -p "$out/crds"
  cp "$snap"/config/crd/snapshot.storage.k8s.io_volumesnapshot*.yaml "$out/crds/"
  chmod -R u+w "$out"
}

fetch_files
build_wrapped external-snapshotter github.com/kubernetes-csi/external-snapshotter/v8 "$SNAPSHOTTER_VERSION" \
  github.com/kubernetes-csi/external-snapshotter/v8/cmd/snapshot-controller \
  github.com/kubernetes-csi/external-snapshotter/v8/cmd/csi-snapshotter
build_wrapped external-provisioner github.com/kubernetes-csi/external-provisioner/v6 "$PROVISIONER_VERSION" \
  github.com/kubernetes-csi/external-provisioner/v6/cmd/csi-provisioner
build_wrapped csi-test github.com/kubernetes-csi/csi-test/v5 "$CSI_TEST_VERSION" \
  github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity
step "done: $out"
