#!/bin/sh
# Resolves the jars of a pom.xml with Maven into a folder and checks each against the
# checksums.sha256 beside the pom. Idempotent: a no-op once they are there and verified.
# Needs no network once they are in the folder or ~/.m2, so a machine without Maven
# Central can be given a copy of the folder.
#
#   sh jars/fetch.sh                             jars/pom.xml (hadoop-aws with its AWS SDK
#                                                bundle and analytics accelerator; S3Proxy)
#                                                into .jars/ (or $TIDEMARK_JARS_DIR)
#   sh jars/fetch.sh jars/readers .jars/readers  the tests' reference readers (delta-spark,
#                                                Iceberg's Spark runtime) into .jars/readers/
set -eu

JARS=$(cd "$(dirname "$0")" && pwd)
HERE=$(cd "${1:-$JARS}" && pwd)
DEST=${2:-${TIDEMARK_JARS_DIR:-$(dirname "$JARS")/.jars}}
mkdir -p "$DEST"
DEST=$(cd "$DEST" && pwd) # (Maven resolves a relative folder against the pom's)
SUMS="$HERE/checksums.sha256"
STAMP="$DEST/.verified"
NAMES=$(awk '{ print $2 }' "$SUMS")

# The stamp is a copy of the checksums last verified: hashing hundreds of MB on every `make setup`
# takes seconds, so only new checksums or a jar changed since then cause a new check.
verified_before() {
	[ -f "$STAMP" ] && cmp -s "$SUMS" "$STAMP" || return 1
	for name in $NAMES; do
		[ -f "$DEST/$name" ] && [ ! "$DEST/$name" -nt "$STAMP" ] || return 1
	done
}

check() { # folder
	(cd "$1" && sha256sum --quiet --strict -c "$SUMS")
}

if verified_before; then
	echo "jars: $(echo $NAMES | wc -w) jars present and verified in $DEST"
	exit 0
fi
mkdir -p "$DEST"
rm -f "$STAMP"
if ! check "$DEST" >/dev/null 2>&1; then
	command -v mvn >/dev/null || {
		check "$DEST" >&2 2>&1 || true
		echo "jars: the jars above are missing or not the pinned ones, and Maven (mvn) is" \
			"not found: install it (Debian: apt-get install maven), or copy a verified" \
			".jars/ folder here from another machine" >&2
		exit 1
	}
	echo "jars: resolving $(echo $NAMES) with Maven into $DEST (once)"
	# a fresh folder, so neither a partial copy nor a stale jar can pass for a good one
	incoming="$DEST/.incoming"
	rm -rf "$incoming"
	mvn -B -q -f "$HERE/pom.xml" dependency:copy-dependencies \
		-DoutputDirectory="$incoming" >"$DEST/.maven.log" 2>&1 || {
		tail -n 30 "$DEST/.maven.log" >&2
		echo "jars: Maven could not resolve jars/pom.xml (log: $DEST/.maven.log)" >&2
		exit 1
	}
	if ! check "$incoming" >&2; then
		echo "jars: checksum mismatch (above): the jars Maven gave are not the pinned ones." \
			"Remove their copies under ~/.m2/repository and run 'sh jars/fetch.sh' again;" \
			"if jars/pom.xml changed on purpose, update jars/checksums.sha256 with it." >&2
		exit 1
	fi
	for name in $NAMES; do mv -f "$incoming/$name" "$DEST/$name"; done
	rm -rf "$incoming" "$DEST/.maven.log"
fi
cp "$SUMS" "$STAMP"
echo "jars: verified $(echo $NAMES) in $DEST"
