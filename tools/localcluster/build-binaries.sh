#!/usr/bin/env bash
# Builds the local cluster (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kubelet, kwok) and helm (the chart's tests install with it) from the published Go modules at pinned versions into
# $WARMSTART_BIN_DIR. Each tool gets its own wrapper module so their dependency
# graphs never mix. Idempotent: a binary already built is skipped.
set -euo pipefail

: "${K8S_VERSION:?}" "${ETCD_VERSION:?}" "${KWOK_VERSION:?}" "${HELM_VERSION:?}" "${WARMSTART_BIN_DIR:?}"
out="$WARMSTART_BIN_DIR"
work="$out.build"
mkdir -p "$out" "$work"

command -v go >/dev/null || { echo "error: Go is required to build the local cluster (https://go.dev/dl)" >&2; exit 2; }
export GOFLAGS="${GOFLAGS:--buildvcs=false}" CGO_ENABLED=0

step() { echo "==> $*"; }

build_kubernetes() {
  local bins=(kube-apiserver kube-controller-manager kube-scheduler kubelet)
  local missing=0
  for b in "${bins[@]}"; do [ -x "$out/$b" ] || missing=1; done
  [ "$missing" = 1 ] || { step "kubernetes $K8S_VERSION: cached"; return; }
  local dir="$work/kubernetes"
  rm -rf "$dir" && mkdir -p "$dir" && cd "$dir"
  step "kubernetes $K8S_VERSION: resolving module (k8s.io/kubernetes requires its staging modules at v0.0.0)"
  go mod init warmstart.local/kubernetes >/dev/null 2>&1
  local kk
  kk=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p')
  [ -n "$kk" ] || { echo "error: could not download k8s.io/kubernetes@$K8S_VERSION (is the Go module proxy reachable?)" >&2; exit 3; }
  local staging="v0${K8S_VERSION#v1}"
  # Every k8s.io/* module that k/k requires at v0.0.0 is pinned to the matching staging tag.
  grep -E '^[[:space:]]*k8s\.io/[^ ]+ v0\.0\.0([[:space:]]|$)' "$kk" | awk '{print $1}' | sort -u | while read -r m; do
    go mod edit -replace="$m=$m@$staging"
  done
  go mod edit -require="k8s.io/kubernetes@$K8S_VERSION"
  cat > tools.go <<GO
//go:build tools
package tools
import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
GO
  step "kubernetes $K8S_VERSION: downloading dependencies"
  go mod tidy >/dev/null 2>"$dir/tidy.log" || { cat "$dir/tidy.log" >&2; exit 3; }
  local pkg="k8s.io/component-base/version"
  local ld="-s -w -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$(echo "$K8S_VERSION" | cut -d. -f2) -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  ld="$ld -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION"
  for b in "${bins[@]}"; do
    [ -x "$out/$b" ] && continue
    step "kubernetes $K8S_VERSION: compiling $b (the first build takes a while)"
    go build -trimpath -ldflags "$ld" -o "$out/$b.tmp" "k8s.io/kubernetes/cmd/$b"
    mv "$out/$b.tmp" "$out/$b"
  done
}

build_etcd() {
  [ -x "$out/etcd" ] && { step "etcd $ETCD_VERSION: cached"; return; }
  local dir="$work/etcd"
  rm -rf "$dir" && mkdir -p "$dir" && cd "$dir"
  step "etcd $ETCD_VERSION: resolving module"
  go mod init warmstart.local/etcd >/dev/null 2>&1
  local gm
  gm=$(go mod download -json "go.etcd.io/etcd/server/v3@$ETCD_VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p')
  [ -n "$gm" ] || { echo "error: could not download go.etcd.io/etcd/server/v3@$ETCD_VERSION" >&2; exit 3; }
  # The server's own go.mod replaces its sibling modules by path; pin them to the same tag.
  grep -Eo 'go\.etcd\.io/etcd/[a-z0-9/]+ +=>' "$gm" | awk '{print $1}' | sort -u | while read -r m; do
    go mod edit -replace="$m=$m@$ETCD_VERSION"
  done
  go mod edit -require="go.etcd.io/etcd/server/v3@$ETCD_VERSION"
  printf '//go:build tools\npackage tools\nimport _ "go.etcd.io/etcd/server/v3"\n' > tools.go
  go mod tidy >/dev/null 2>"$dir/tidy.log" || { cat "$dir/tidy.log" >&2; exit 3; }
  step "etcd $ETCD_VERSION: compiling"
  go build -trimpath -ldflags "-s -w" -o "$out/etcd.tmp" go.etcd.io/etcd/server/v3
  mv "$out/etcd.tmp" "$out/etcd"
}

build_kwok() {
  [ -x "$out/kwok" ] && { step "kwok $KWOK_VERSION: cached"; return; }
  step "kwok $KWOK_VERSION: compiling"
  GOBIN="$work/kwok-bin" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
  mv "$work/kwok-bin/kwok" "$out/kwok"
  # kwok needs stage definitions: keep the module's own stage files beside the binary.
  local src
  src=$(go list -m -json "sigs.k8s.io/kwok@$KWOK_VERSION" 2>/dev/null | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p')
  [ -n "$src" ] || src=$(go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p')
  rm -rf "$out/kwok-stages" && mkdir -p "$out/kwok-stages"
  cp -r "$src/kustomize/stage/." "$out/kwok-stages/"
  chmod -R u+w "$out/kwok-stages"
}

build_helm() {
  # Rebuilt when the pinned version changes (the folder name only carries the cluster's versions).
  if [ -x "$out/helm" ] && [ "$("$out/helm" version --template '{{.Version}}' 2>/dev/null)" = "$HELM_VERSION" ]; then
    step "helm $HELM_VERSION: cached"; return
  fi
  step "helm $HELM_VERSION: compiling"
  # The variables helm's Makefile sets: its version, and the Kubernetes version of its client
  # modules (what `helm template` renders for when no cluster is asked; the default is 1.20).
  local gm kv
  gm=$(go mod download -json "helm.sh/helm/v3@$HELM_VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p')
  [ -n "$gm" ] || { echo "error: could not download helm.sh/helm/v3@$HELM_VERSION" >&2; exit 3; }
  kv=$(awk '$1 == "k8s.io/client-go" { sub(/^v0\./, "", $2); split($2, v, "."); print v[1] }' "$gm")
  local ld="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
  for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
    ld="$ld -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$kv"
  done
  GOBIN="$work/helm-bin" go install -trimpath -ldflags "$ld" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  mv "$work/helm-bin/helm" "$out/helm"
}

case "${1:-all}" in
  kubernetes) build_kubernetes ;;
  etcd) build_etcd ;;
  kwok) build_kwok ;;
  helm) build_helm ;;
  all) build_etcd; build_kwok; build_kubernetes; build_helm ;;
esac
step "done: $out"
