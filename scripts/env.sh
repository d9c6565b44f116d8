# Shared setup for the project's scripts: toolchain and a build directory
# outside the clone, so repeated clones (and CI) reuse compiled dependencies.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/anode/target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
cd "$ROOT"
if ! command -v cargo >/dev/null 2>&1; then
    echo "cargo not found: install Rust with rustup (https://rustup.rs)" >&2
    exit 1
fi
# rust-toolchain.toml pins the toolchain; rustup installs it on first use.
