#!/bin/sh
# Installs Toxiproxy's server (MIT, Go) as .tools/bin/toxiproxy-server for the tests
# that put real network faults between tidemark and its object store. Idempotent.
set -eu

VERSION=v2.12.0
MODULE=github.com/Shopify/toxiproxy/v2
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN="$ROOT/.tools/bin"
TARGET="$BIN/toxiproxy-server"

command -v go >/dev/null || { echo "toxiproxy: 'go' not found: install Go to build Toxiproxy $VERSION" >&2; exit 1; }
# its -version prints "git" when built by go install: ask the binary's build info instead
if [ -x "$TARGET" ] && go version -m "$TARGET" 2>/dev/null | grep -q "mod[[:space:]]*$MODULE[[:space:]]*$VERSION[[:space:]]"; then
	echo "toxiproxy: $TARGET ($VERSION) present"
	exit 0
fi
echo "toxiproxy: go install $MODULE/cmd/server@$VERSION -> $TARGET"
STAGE="$BIN/.toxiproxy-$VERSION"
mkdir -p "$STAGE"
# the module names its binary 'server': build it aside and give it a clear name
GOBIN="$STAGE" go install "$MODULE/cmd/server@$VERSION"
mv -f "$STAGE/server" "$TARGET"
rmdir "$STAGE"
