#!/usr/bin/env bash
# Installs the system packages tisim uses, when we are root and apt is there:
#   libsuitesparse-dev  - CHOLMOD + METIS headers, to build scikit-sparse (fast sparse Cholesky)
#   libopenblas0-pthread - an optimised BLAS for CHOLMOD's supernodal factorisation (Debian's
#                          default libblas3 is the reference BLAS: 4x slower on the cloth systems)
#   mesa-vulkan-drivers - software Vulkan, so GGUI can render off-screen on machines without a GPU
#   libvulkan1          - the Vulkan loader
#   python3-venv        - Debian's python3 lacks ensurepip without it
#   xvfb, xdotool       - a virtual X display and synthetic input, for the live window's
#                         end-to-end test (tests/demos/test_live_window.py; skipped without them)
# Without root/apt it only says what is missing; tisim then falls back
# (scipy Cholesky, headless runs without images).
set -u
pkgs=(libsuitesparse-dev libopenblas0-pthread mesa-vulkan-drivers libvulkan1 python3-venv xvfb xdotool)
missing=()
if command -v dpkg-query >/dev/null 2>&1; then
  for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
else
  echo "tisim: not a Debian/Ubuntu system; make sure SuiteSparse headers and a Vulkan driver are installed for the fast paths." >&2
  exit 0
fi
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "tisim: installing system packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  if ! { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null; }; then
    echo "warning: could not install ${missing[*]}; continuing with fallbacks (scipy Cholesky, no off-screen images)" >&2
  fi
else
  echo "warning: missing system packages: ${missing[*]} (run 'sudo apt-get install ${missing[*]}');" \
       "continuing with fallbacks: scipy Cholesky instead of CHOLMOD, headless runs without images" >&2
fi
exit 0
