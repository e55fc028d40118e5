#!/bin/sh
# Installs Versity's S3 gateway (versitygw, Apache-2.0, Go) as .tools/bin/versitygw: the
# second S3 server the object-store tests run the store's conditional writes against
# (beside S3Proxy). Idempotent.
set -eu

VERSION=v1.8.0
MODULE=github.com/versity/versitygw
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN="$ROOT/.tools/bin"
TARGET="$BIN/versitygw"

command -v go >/dev/null || { echo "versitygw: 'go' not found: install Go to build versitygw $VERSION" >&2; exit 1; }
if [ -x "$TARGET" ] && go version -m "$TARGET" 2>/dev/null | grep -q "mod[[:space:]]*$MODULE[[:space:]]*$VERSION[[:space:]]"; then
	echo "versitygw: $TARGET ($VERSION) present"
	exit 0
fi
echo "versitygw: go install $MODULE/cmd/versitygw@$VERSION -> $TARGET"
mkdir -p "$BIN"
GOBIN="$BIN" go install "$MODULE/cmd/versitygw@$VERSION"
