#!/bin/sh
# Builds one Go program the tests start into .tools/bin/NAME, at an exact version, with
# `go install` (the Go module proxy; nothing at run time). Idempotent: a binary built
# from that module version is kept.
# Usage: sh jars/go-tool.sh NAME MODULE PACKAGE VERSION
set -eu

NAME=$1
MODULE=$2
PACKAGE=$3
VERSION=$4
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN="$ROOT/.tools/bin"
TARGET="$BIN/$NAME"

command -v go >/dev/null || { echo "$NAME: 'go' not found: install Go to build $NAME $VERSION" >&2; exit 1; }
# (its build info names the module and version it was built from)
if [ -x "$TARGET" ] && go version -m "$TARGET" 2>/dev/null | grep -q "mod[[:space:]]*$MODULE[[:space:]]*$VERSION[[:space:]]"; then
	echo "$NAME: $TARGET ($VERSION) present"
	exit 0
fi
echo "$NAME: go install $PACKAGE@$VERSION -> $TARGET"
# built aside, then named: a module may name its binary otherwise ('server')
STAGE="$BIN/.$NAME-$VERSION"
mkdir -p "$STAGE"
GOBIN="$STAGE" go install "$PACKAGE@$VERSION"
mv -f "$STAGE/$(basename "$PACKAGE")" "$TARGET"
rmdir "$STAGE"
