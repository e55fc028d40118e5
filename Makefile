# tidemark: `make demo` runs it on embedded defaults, `make test` runs the suite.
# Both install what they need first (a venv with the package and its extras).

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST := $(PY) -m pytest
export PYSPARK_PYTHON := $(abspath $(PY))

.PHONY: setup java iceberg prometheus fuse browser objectstore readers archive test test-fast test-integration test-compose lint demo bench clean jvm docs

setup: java iceberg prometheus fuse browser objectstore readers $(STAMP) archive

# The Spark driver's class-data archives (tidemark jvm-archive): every local session,
# a service's start included, maps the classes from one file instead of loading them
# from jars (session 4.1-5.0 s instead of 6.2-7.6 s here). Made after the jars, once per
# class path (about 40 s each: on disk, and with S3A's jars); a jar that changed makes
# a new one, the old is deleted.
archive: java iceberg objectstore $(STAMP)
	@$(PY) -m tidemark jvm-archive

$(STAMP): pyproject.toml setup.py service/tidemark/_fastpath.pyx
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	@$(PY) tests/settle_libraries.py $(VENV)
	@touch $(STAMP)

# Spark 4 needs Java 17+. As root we install it; otherwise we say what to do.
java:
	@v=$$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1); \
	if [ -n "$$v" ] && [ "$$v" -ge 17 ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "Java 17 not found (got '$$v'): installing openjdk-17-jre-headless"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless; \
	else \
		echo "tidemark needs Java 17 or newer for Spark (found: '$${v:-none}')."; \
		echo "Install it, e.g. 'sudo apt-get install openjdk-17-jre-headless', or set JAVA_HOME."; \
		exit 1; \
	fi

# Iceberg's Java library and the JDBC drivers of the SQL catalogs, with which a local
# Spark session commits Iceberg changelogs in its driver (tidemark.sink.iceberg.jvm;
# without them pyiceberg commits): by Maven into .jars/iceberg/ (jars/iceberg/pom.xml,
# checksums beside it, 6 MB).
iceberg:
	@sh jars/fetch.sh jars/iceberg $${TIDEMARK_JARS_DIR:-.jars}/iceberg

# The alert tests need promtool and a Prometheus server, and the source-side slot metrics
# postgres_exporter (Debian: prometheus, prometheus-postgres-exporter). As root we install
# them; otherwise the tests that need them are skipped and say why. Installing Debian's
# prometheus package also enables its systemd service (started where systemd runs).
prometheus:
	@if command -v promtool >/dev/null && command -v prometheus >/dev/null \
		&& command -v prometheus-postgres-exporter >/dev/null; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing Prometheus, promtool and postgres_exporter (Debian packages)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			--no-install-recommends prometheus prometheus-postgres-exporter; \
	else \
		echo "note: promtool/prometheus/prometheus-postgres-exporter not found: the alert tests"; \
		echo "will be skipped. Install them with 'sudo apt-get install prometheus"; \
		echo "prometheus-postgres-exporter' (or run make setup as root)."; \
	fi

# The crash tests mount tests/crashfs (a FUSE file system that forgets what was not
# synced): they need fusermount3 and libfuse 3 (Debian: fuse3, libfuse3-3) and /dev/fuse.
# As root we install the packages; otherwise those tests are skipped and say why.
fuse:
	@if command -v fusermount3 >/dev/null \
		&& PATH="$$PATH:/sbin:/usr/sbin" ldconfig -p | grep -q 'libfuse3\.so\.3 '; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing fusermount3 and libfuse 3 (Debian packages fuse3, libfuse3-3)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			--no-install-recommends fuse3 libfuse3-3; \
	else \
		echo "note: fusermount3/libfuse 3 not found: the crashfs tests will be skipped."; \
		echo "Install them with 'sudo apt-get install fuse3 libfuse3-3' (or run make setup"; \
		echo "as root)."; \
	fi

# The status page's tests drive a headless chromium through Playwright, Debian's build
# (/usr/bin/chromium; Playwright's own browser download is not used). As root we install
# it; otherwise those tests are skipped and say why.
browser:
	@if [ -x /usr/bin/chromium ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing chromium for the status page's browser tests (Debian package)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			--no-install-recommends chromium; \
	else \
		echo "note: /usr/bin/chromium not found: the status page's browser tests will be"; \
		echo "skipped. Install it with 'sudo apt-get install chromium' (or run make setup"; \
		echo "as root)."; \
	fi

# The object-store tests: S3A's jars (hadoop-aws of pyspark's Hadoop, its AWS SDK bundle)
# and the S3 server S3Proxy, resolved by Maven into .jars/ and checked against
# jars/checksums.sha256 (about 740 MB, once; a machine without Maven Central can be given
# a copy of .jars/), and Toxiproxy (Go) for real network faults and versitygw (Go), the
# second S3 server, into .tools/bin.
objectstore:
	@sh jars/fetch.sh
	@sh jars/toxiproxy.sh
	@sh jars/versitygw.sh

# The reference readers of the tests (tests/integration/test_reference_readers.py):
# Delta's own Spark reader (delta-spark) and Iceberg's Spark runtime, in a Spark of their
# own: Iceberg's runtime stops at Spark 4.1 and delta-spark 4.4 at 4.2, while tidemark
# runs 4.3. pyspark 4.1 in .venv-readers (jars/readers/requirements.txt), the jars by
# Maven into .jars/readers/ (jars/readers/pom.xml, checksums beside it: with the JDBC
# drivers of the Iceberg catalogs and S3A of pyspark 4.1's Hadoop, for tables on S3).
# Beside them, Iceberg's own REST catalog server (tests/integration/rest_catalog.py), by
# Maven into .jars/restcatalog/ (jars/restcatalog/pom.xml, 30 MB).
READERS_VENV := .venv-readers
readers: $(READERS_VENV)/.installed
	@sh jars/fetch.sh jars/readers .jars/readers
	@sh jars/fetch.sh jars/restcatalog .jars/restcatalog

$(READERS_VENV)/.installed: jars/readers/requirements.txt
	@test -x $(READERS_VENV)/bin/python || $(PYTHON) -m venv $(READERS_VENV)
	$(READERS_VENV)/bin/python -m pip install --quiet -r jars/readers/requirements.txt
	@touch $@

# Two workers, one for each core: a module runs whole on one of them (its fixtures shared),
# the slowest modules first (tests/conftest.py), so both end together; in that order, not
# xdist's own (--no-loadscope-reorder: it would start the modules of most tests first and
# leave the few long ones to the end). TEST_WORKERS=0 runs the tests in pytest's own
# process (one at a time, as a debugger wants).
TEST_WORKERS ?= 2
XDIST := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)

# Pure cores only: no Postgres, no Spark.
test-fast: setup
	$(PYTEST) tests/unit -q -p no:cacheprovider $(XDIST)

# Real Postgres (embedded PG 16, the system's PG 15 if installed, PG 18 for some modules) and a real Spark.
test-integration: setup
	$(PYTEST) tests/integration -q -p no:cacheprovider $(XDIST)

test: setup
	$(PYTEST) tests -q -p no:cacheprovider -rs --durations=25 $(XDIST)

# docker-compose.yml run for real, under podman (no Docker engine or image registry on our
# machines): deploy/podman/setup.sh installs podman (Debian packages) and builds the
# images, tidemark's from deploy/Dockerfile; tests/compose then runs the stack. Root and
# Debian only; `.ci/run` calls it after `make test`.
test-compose: setup
	@if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then \
		echo "make test-compose runs rootful podman: it needs root on Debian (apt-get)."; \
		exit 1; \
	fi
	$(PY) -m pip install --quiet 'podman-compose>=1.6,<2'
	sh deploy/podman/setup.sh
	TIDEMARK_COMPOSE_TESTS=1 $(PYTEST) tests/compose -q -s -p no:cacheprovider --durations=0

lint: setup
	$(VENV)/bin/ruff check service tests bench
	$(VENV)/bin/ruff format --check service tests bench
	$(VENV)/bin/mypy

# Java and the package only: the system packages of `setup` (Prometheus, FUSE, chromium)
# and the container engine are for the tests, not for trying tidemark out.
demo: java $(STAMP)
	$(PY) -m tidemark demo $(if $(FORMAT),--format $(FORMAT),)

bench: setup
	$(PY) -m bench

# The docs site from docs/ (mkdocs, strict: a broken link or anchor fails) into site/.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

# tidemark's Java classes (service/tidemark/jvm/*.java) into the
# committed jar beside it. Needs a JDK (javac, jar); running tidemark needs only a JRE.
JVM_DIR := service/tidemark/jvm
jvm: setup
	@rm -rf build/jvm && mkdir -p build/jvm
	javac --release 17 -cp "$$($(PY) -m tidemark.jvm classpath $${TIDEMARK_JARS_DIR:-.jars})" -d build/jvm $(JVM_DIR)/*.java
	jar --create --date=2026-01-01T00:00:00Z --file $(JVM_DIR)/tidemark-jvm.jar -C build/jvm .
	@rm -rf build/jvm
	@$(PY) -m tidemark jvm-archive

clean:
	rm -rf $(VENV) $(READERS_VENV) demo-data site .pytest_cache .mypy_cache .ruff_cache
