# isobox — see README.md. Every target works on a fresh Debian 12 machine as root.
SHELL := /bin/bash
CARGO ?= cargo
ROOTFS_DIR ?= /var/lib/isobox/rootfs
# Root filesystems `make runtimes` builds (runtimes/rootfs/NAME.packages): Debian 13
# (trixie), the default version of every language (about 4 minutes from scratch).
RUNTIMES ?= python-slim python node ruby go rust
# Further versions, the same package lists on Debian testing (forky): Python 3.14, Node 24,
# a newer Go and Rust (about 4 minutes more). `make newer-runtimes` builds them, and
# `make test` does, because the suite checks every version; isoboxd offers each one
# that is built (GET /runtimes).
NEWER_RUNTIMES ?= python-slim-forky python-forky node-forky go-forky rust-forky
ISOBOX_BUILD_VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
export ISOBOX_BUILD_VERSION
export PATH := $(HOME)/.cargo/bin:$(PATH)

SYSTEM_PACKAGES := runsc nftables iproute2 debootstrap util-linux coreutils curl ca-certificates python3 python3-venv e2fsprogs erofs-utils jq

.PHONY: run test build ui-vendor node wasm-snapshot deb deps runtimes newer-runtimes fmt lint check-unsafe check-modules check-fuzz fuzz bench test-venv test-ui-deps test-promtool test-deb-deps test-wheels test-wasm-ext clean

## run: install what is missing, build, and start isoboxd on 127.0.0.1:8090
run: deps runtimes ui-vendor build wasm-snapshot
	./target/release/isoboxd

## test: the whole suite (unit + integration with real runsc, cgroups and sockets)
test: deps runtimes newer-runtimes ui-vendor test-venv test-ui-deps test-promtool test-deb-deps test-wheels test-wasm-ext
	vendor-runsc/verify.sh
	$(CARGO) build --release --bins
	$(MAKE) wasm-snapshot
	$(CARGO) test --release --no-fail-fast -- --test-threads=2

build: ui-vendor
	$(CARGO) build --release

## ui-vendor: the web UI's third-party code (xterm.js, CodeMirror 6) from npm, pinned
## and checked by ui/vendor/package-lock.json, the editor bundled by esbuild into
## ui/vendor/dist/editor.js; build.rs builds them into isoboxd (without them the page
## has no terminal, and says so, and its cells are plain text areas)
ui-vendor: node
	@if [ ! -f ui/vendor/node_modules/.package-lock.json ] || [ ui/vendor/package-lock.json -nt ui/vendor/node_modules/.package-lock.json ]; then \
		npm ci --prefix ui/vendor --no-audit --no-fund; \
	fi
	@cd ui/vendor && if [ ! -f dist/editor.js ] || [ editor.js -nt dist/editor.js ] || [ build.mjs -nt dist/editor.js ] || [ node_modules/.package-lock.json -nt dist/editor.js ]; then \
		echo "bundling the code editor: ui/vendor/dist/editor.js"; node build.mjs; \
	fi

## node: Node.js and npm (Debian's, unless a node is installed already, e.g.
## NodeSource's, which bundles npm)
node:
	@missing=""; command -v node >/dev/null || missing="nodejs"; \
	command -v npm >/dev/null || missing="$$missing npm"; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $$missing; \
	fi

## wasm-snapshot: the eryx face's pre-initialised, pre-compiled Python (~60 MB, ~20 s
## once per eryx version and CPU) in ISOBOX_WASM_CACHE_DIR; isoboxd also makes it at
## start when it is missing
WASM_CACHE_DIR ?= /var/cache/isobox/wasm
wasm-snapshot:
	@./target/release/isobox-wasm prepare --cache $(WASM_CACHE_DIR) >/dev/null

## deb: the Debian package (isoboxd, the systemd unit, isobox-runtimes) in target/deb
deb: build
	deb/build.sh target/deb

## deps: Debian packages the daemon and its tests need (installed only when missing)
deps:
	@vendor-runsc/apt-source.sh
	@missing=""; for p in $(SYSTEM_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $$missing; \
	fi
	@# On Debian 12 the runsc isobox is tested with (vendor-runsc/VERSION) comes from
	@# bookworm-backports (vendor-runsc/apt-source.sh); elsewhere the host's own is kept.
	@want="$$(cat vendor-runsc/VERSION)"; have="$$(dpkg-query -W -f='$${Version}' runsc 2>/dev/null || true)"; \
	if [ "$$have" != "$$want" ] && [ -f /etc/apt/preferences.d/isobox-runsc-backports ] \
		&& grep -qs '^VERSION_CODENAME=bookworm$$' /etc/os-release; then \
		apt-get update; \
		apt-cache show "runsc=$$want" >/dev/null 2>&1 || { echo "vendor-runsc: runsc $$want is no longer in bookworm-backports: bump vendor-runsc/VERSION (vendor-runsc/README.md)" >&2; exit 1; }; \
		echo "installing: runsc=$$want (was $${have:-none})"; \
		DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends --allow-downgrades "runsc=$$want"; \
	fi
	@command -v $(CARGO) >/dev/null || { echo "cargo not found: install Rust (rustup) first" >&2; exit 1; }

## runtimes: build (or refresh) the runtimes' root filesystems from Debian packages
## (ROOTFS_DIR is root's alone, 0700: go's tree holds a build cache owned by the
## sandbox user, uid 65534, that no process of the host's nobody may reach)
runtimes:
	@install -d -m 0700 $(ROOTFS_DIR) && chmod 0700 $(ROOTFS_DIR)
	@for r in $(RUNTIMES); do runtimes/rootfs/build.sh $$r $(ROOTFS_DIR)/$$r || exit 1; done

## newer-runtimes: the further versions (NEWER_RUNTIMES) from Debian testing
newer-runtimes:
	@install -d -m 0700 $(ROOTFS_DIR) && chmod 0700 $(ROOTFS_DIR)
	@for r in $(NEWER_RUNTIMES); do runtimes/rootfs/build.sh $$r $(ROOTFS_DIR)/$$r || exit 1; done

## test-venv: Python clients the integration tests use (SSE client, OpenAPI validator), and
## schemathesis in a venv of its own (tests/schemathesis.rs)
test-venv:
	@test -x /tmp/isobox-test-venv/bin/python || python3 -m venv /tmp/isobox-test-venv
	@/tmp/isobox-test-venv/bin/pip install -q -r tests/python/requirements.txt -r tests/openapi/requirements.txt
	@test -x /tmp/isobox-st-venv/bin/python || python3 -m venv /tmp/isobox-st-venv
	@/tmp/isobox-st-venv/bin/pip install -q -r tests/schemathesis/requirements.txt

## test-wheels: the packages tests/eryx_envs.rs uploads to eryx environments, from PyPI,
## pinned by hash (tests/python/env-*.txt), into /var/cache/isobox-tools/wheels
WHEELS := /var/cache/isobox-tools/wheels
test-wheels: test-venv
	@if [ ! -f $(WHEELS)/.complete-1 ]; then \
		rm -rf $(WHEELS) && mkdir -p $(WHEELS)/src && \
		/tmp/isobox-test-venv/bin/pip download -q --no-deps --require-hashes -d $(WHEELS)/src \
			--only-binary=jinja2 --no-binary=markupsafe -r tests/python/env-packages.txt && \
		mv $(WHEELS)/src/jinja2-*.whl $(WHEELS)/ && \
		CC=/bin/false /tmp/isobox-test-venv/bin/pip wheel -q --no-deps -w $(WHEELS) $(WHEELS)/src/markupsafe-3.0.2.tar.gz && \
		/tmp/isobox-test-venv/bin/pip download -q --no-deps --require-hashes -d $(WHEELS)/native \
			--only-binary=:all: --platform manylinux2014_x86_64 --python-version 3.11 \
			--implementation cp --abi cp311 -r tests/python/env-native.txt && \
		rm -rf $(WHEELS)/src && touch $(WHEELS)/.complete-1 && ls $(WHEELS) $(WHEELS)/native; \
	fi

## test-wasm-ext: wheels with WebAssembly extension modules for tests/eryx_envs.rs,
## compiled from tests/wasm-ext/ext.c by Debian's clang and wasm-ld (clang-19 and
## lld-19, installed when missing) into /var/cache/isobox-tools/wasm-ext
WASM_EXT := /var/cache/isobox-tools/wasm-ext
WASM_LLVM ?= 19
test-wasm-ext:
	@missing=""; for p in clang-$(WASM_LLVM) lld-$(WASM_LLVM); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $$missing; \
	fi
	@if [ ! -f $(WASM_EXT)/.complete ] || [ tests/wasm-ext/ext.c -nt $(WASM_EXT)/.complete ] || [ tests/wasm-ext/build.sh -nt $(WASM_EXT)/.complete ]; then \
		rm -rf $(WASM_EXT) && \
		WASM_CC=clang-$(WASM_LLVM) WASM_LD=wasm-ld-$(WASM_LLVM) tests/wasm-ext/build.sh $(WASM_EXT) && \
		touch $(WASM_EXT)/.complete && ls $(WASM_EXT); \
	fi

## test-promtool: Prometheus's own checker, for the test of GET /metrics (tests/metrics.rs):
## promtool, taken out of Debian's prometheus package with apt-get download and dpkg-deb
## into /var/cache/isobox-tools, without installing the package (no service, no user)
PROMTOOL := /var/cache/isobox-tools/promtool
test-promtool:
	@if [ ! -x $(PROMTOOL) ]; then \
		d=$$(mktemp -d) && cd $$d && \
		{ apt-get download prometheus >/dev/null 2>&1 || { apt-get update >/dev/null && apt-get download prometheus; }; } && \
		dpkg-deb -x prometheus_*.deb x && mkdir -p $(dir $(PROMTOOL)) && \
		install -m 0755 x/usr/bin/promtool $(PROMTOOL) && cd / && rm -rf $$d && \
		echo "installed $(PROMTOOL): $$($(PROMTOOL) --version 2>&1 | head -1)"; \
	fi

## test-deb-deps: lintian, which tests/package.rs runs on the package (Debian's
## lintian; dpkg-deb, dpkg-shlibdeps and systemd-analyze are on Debian 12 already)
test-deb-deps:
	@missing=""; for p in lintian dpkg-dev systemd; do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $$missing; \
	fi

## test-ui-deps: what the UI's browser test needs: Debian's chromium, node and npm (kept
## when already installed, e.g. NodeSource's nodejs, which bundles npm), and
## playwright-core from npm, pinned by tests/ui/package-lock.json
test-ui-deps: node
	@missing=""; dpkg -s chromium >/dev/null 2>&1 || missing="chromium"; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $$missing; \
	fi
	@if [ ! -f tests/ui/node_modules/.package-lock.json ] || [ tests/ui/package-lock.json -nt tests/ui/node_modules/.package-lock.json ]; then \
		npm ci --prefix tests/ui --no-audit --no-fund; \
	fi

fmt:
	$(CARGO) fmt --all

lint:
	$(CARGO) clippy --all-targets -- -D warnings

## check-fuzz: the fuzz targets still build against the crate (CI checks them first,
## before the suite, so that a change to a type they build fails in minutes)
check-fuzz:
	cd fuzz && $(CARGO) check --bins --quiet

## check-unsafe: raw `unsafe` is allowed only in src/sys/ (and src/store/env.rs)
check-unsafe:
	@bad=$$(grep -rn 'unsafe' src --include=*.rs | grep -v '^src/sys/' | grep -v '^src/store/env.rs' | grep -vE '^\S+:\s*(//|#!\[deny\(unsafe_op_in_unsafe_fn)' | grep -E 'unsafe *(\{|fn|impl)' || true); \
	if [ -n "$$bad" ]; then echo "unsafe outside src/sys/:"; echo "$$bad"; exit 1; fi; echo "check-unsafe: ok"

## check-modules: no two top-level modules of src/ import each other, directly or in a
## circle (imports run one way: faces -> core -> sys; issue 20)
check-modules:
	@python3 .ci/module-cycles.py

bench:
	bash bench/run.sh

FUZZ_SECONDS ?= 60

## fuzz: build the libFuzzer targets on stable (RUSTC_BOOTSTRAP=1) and run each FUZZ_SECONDS
fuzz:
	@command -v cargo-fuzz >/dev/null || $(CARGO) install cargo-fuzz --locked
	fuzz/run.sh $(FUZZ_SECONDS)

clean:
	$(CARGO) clean
