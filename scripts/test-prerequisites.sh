#!/bin/sh
# What `make test` and `make test-fast` need beyond .venv: a headless Chromium for the browser tests
# (TensorBoard's Images page, the Attention tab, `plot-attention --html`). The one place that sets
# it up: the Makefile's test targets run this first, and .ci/run runs `make test`.
#
# Present (chromium, chromium-browser or google-chrome on PATH, as the tests look for it): nothing
# to do. Missing: Debian's `chromium` is installed with apt-get as root, or with sudo where sudo needs
# no password; otherwise one line names the command to run, and the exit status stops make before
# any test starts. It finds every tool (id, sudo, apt-get) on PATH.
set -u

have_a_browser() {
  for name in chromium chromium-browser google-chrome; do
    command -v "$name" >/dev/null 2>&1 && return 0
  done
  return 1
}

refuse() {
  echo "make test needs Debian's chromium for its browser tests: $1" >&2
  exit 1
}

have_a_browser && exit 0

command -v apt-get >/dev/null 2>&1 ||
  refuse "no apt-get here: install Chromium (chromium, chromium-browser or google-chrome on PATH) and rerun"
if [ "$(id -u)" = 0 ]; then
  as_root=""
elif command -v sudo >/dev/null 2>&1 && sudo -n true >/dev/null 2>&1; then
  as_root="sudo"
else
  refuse "run \`sudo apt-get install chromium\` (or put chromium on PATH), then make test again"
fi

echo "make test: installing Debian's chromium for the browser tests (${as_root:-as root}: apt-get install chromium)"
# shellcheck disable=SC2086  # $as_root: empty, or one word
$as_root apt-get update -q &&
  $as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium ||
  refuse "\`${as_root:+$as_root }apt-get install chromium\` failed (its output is above)"
have_a_browser || refuse "apt-get installed chromium, yet no chromium is on PATH"
