#!/usr/bin/env bash
# Installs cjax's build dependencies from Debian packages, idempotently (nothing to do when present).
set -euo pipefail
packages=(cmake g++ ninja-build ccache llvm-19-dev libfmt-dev libabsl-dev doctest-dev libopenblas-dev libxsmm-dev nlohmann-json3-dev libgloo-dev gdb python3 python3-numpy)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
