#!/usr/bin/env bash
# Fails when anything generated is stale: deepcopy, CRDs, go.mod/go.sum of both modules.
# It regenerates into the work tree and lets git say whether anything changed.
set -euo pipefail
cd "$(dirname "$0")/.."

generated=(apis charts/diskpipe/crds go.mod go.sum test/tools/go.mod test/tools/go.sum)

before=$(git status --porcelain -- "${generated[@]}")
if [ -n "$before" ]; then
  echo "verify: commit or stash these first, so a stale file can be told from your edit:" >&2
  echo "$before" >&2
  exit 1
fi

make -s generate manifests
go mod tidy
(cd test/tools && go mod tidy)

after=$(git status --porcelain -- "${generated[@]}")
if [ -n "$after" ]; then
  echo "verify: generated files are stale; run 'make generate manifests' and 'go mod tidy', then commit:" >&2
  echo "$after" >&2
  git --no-pager diff --stat -- "${generated[@]}" >&2
  exit 1
fi
echo "verify: generated files are current"
