#!/usr/bin/env bash
# Regenerates src/workspace_capnp.rs from workspace.capnp. Needs the `capnp`
# compiler and its standard schemas: apt-get install capnproto libcapnp-dev.
# The same code path, without WSD_SCHEMA_BLESS, is the test that fails when
# the committed file is stale.
set -euo pipefail
cd "$(dirname "$0")/.."
WSD_SCHEMA_BLESS=1 cargo test -p wsd-schema --test regenerate -- --nocapture
