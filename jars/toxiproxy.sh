#!/bin/sh
# Installs Toxiproxy's server (MIT, Go) as .tools/bin/toxiproxy-server for the tests
# that put real network faults between tidemark and its object store. Idempotent.
set -eu
exec sh "$(dirname "$0")/go-tool.sh" toxiproxy-server github.com/Shopify/toxiproxy/v2 \
	github.com/Shopify/toxiproxy/v2/cmd/server v2.12.0
