#!/usr/bin/env bash
# Fails when anything generated is stale: deepcopy, CRDs, the API reference and the
# troubleshooting page's reasons, go.mod/go.sum of every module; when a link between the docs
# is broken; and when a tracked file is a built binary or larger than 1 MiB.
# It regenerates in place and compares each generated file with what was there before, so it
# works on a tree with uncommitted edits too; a stale file is left regenerated.
set -euo pipefail
cd "$(dirname "$0")/.."

snapshot() {
  find apis charts/diskpipe/files/crds charts/diskpipe/files/cdi charts/diskpipe/files/cdi-policies charts/diskpipe/templates/rbac test/crds -type f \( -name 'zz_generated*' -o -name '*.yaml' \) -print0 |
    sort -z | xargs -0 sha256sum
  sha256sum docs/api.md docs/troubleshooting.md
  sha256sum go.mod go.sum test/tools/go.mod test/tools/go.sum
}

# Nothing built is committed, and nothing large: tests make their fixtures (qemu-img, mkfs).
# Deliberate exceptions over 1 MiB would be listed here; there are none.
large_exceptions=()
status=0
while IFS= read -r -d '' f; do
  [ -f "$f" ] || continue
  if [ "$(head -c 4 "$f" | od -An -tx1 | tr -d ' ')" = "7f454c46" ]; then
    echo "verify: $f is a built binary (ELF): remove it from git and let the build make it" >&2
    status=1
  fi
  size=$(stat -c %s "$f")
  if [ "$size" -gt $((1 << 20)) ] && [[ ! " ${large_exceptions[*]} " == *" $f "* ]]; then
    echo "verify: $f is $size bytes, over 1 MiB: generate it in the tests or the build instead" >&2
    status=1
  fi
done < <(git ls-files -z)
[ "$status" = 0 ] || exit 1
go run ./hack/docs links

# test/tools compiles the packages it shares with diskpipe once only where both take them from
# the same module version, with the same flags (Makefile, KUBE_BINS): name any that drifted.
packages() {
  go list -deps -f '{{if not .Standard}}{{.ImportPath}} {{with .Module}}{{.Path}}@{{.Version}}{{end}}{{end}}' "$@" |
    awk 'NF == 2' | sort -u
}
drift=$(join <(packages -test ./...) <(cd test/tools && packages $(sed -n 's/^\t_ "\(.*\)"$/\1/p' tools.go) ./cmd/...) |
  awk '$2 != $3 {print "  " $2 " (diskpipe) against " $3 " (test/tools)"}' | sort -u)
if [ -n "$drift" ]; then
  echo "verify: test/tools/go.mod and go.mod take shared packages from different versions; require diskpipe's in test/tools (or raise diskpipe's):" >&2
  echo "$drift" >&2
  exit 1
fi

# The layers hold for whole binaries too (the linter's depguard sees direct imports only):
# versitygw only in the store's command, the controllers only in the manager's.
for cmd in cmd/*/; do
  cmd=${cmd%/}
  deps=$(go list -deps "./$cmd")
  if [ "$cmd" != cmd/objectstore ] && grep -q '^github.com/versity/versitygw' <<<"$deps"; then
    echo "verify: $cmd links versitygw: only cmd/objectstore may (objectstore/gateway)" >&2
    exit 1
  fi
  if [ "$cmd" != cmd/manager ] && grep -q '^github.com/diskpipe/diskpipe/controllers' <<<"$deps"; then
    echo "verify: $cmd links a controller: only cmd/manager may" >&2
    exit 1
  fi
done

before=$(snapshot)
make -s generate manifests
go mod tidy
(cd test/tools && go mod tidy)
after=$(snapshot)

if [ "$before" != "$after" ]; then
  echo "verify: these generated files were stale and are now regenerated; commit them:" >&2
  diff <(echo "$before") <(echo "$after") | grep '^>' | awk '{print "  " $3}' >&2
  exit 1
fi
echo "verify: generated files are current"
