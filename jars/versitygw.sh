#!/bin/sh
# Installs Versity's S3 gateway (versitygw, Apache-2.0, Go) as .tools/bin/versitygw: the
# second S3 server the object-store tests run the store's conditional writes against
# (beside S3Proxy). Idempotent.
set -eu
exec sh "$(dirname "$0")/go-tool.sh" versitygw github.com/versity/versitygw \
	github.com/versity/versitygw/cmd/versitygw v1.8.0
