#!/usr/bin/env bash
# Install the AWS SAM CLI and cfn-lint into their own venv, .venv-sam (they are heavy and pin
# their own dependencies, so they stay out of .venv). Idempotent: a second run only checks.
# Usage: scripts/setup-sam.sh    then: .venv-sam/bin/sam validate --lint
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
"$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "setup-sam: Python 3.11 or newer is needed"; exit 1; }
venv=.venv-sam
packages=(aws-sam-cli cfn-lint)
# One install at a time: scripts/run-tests.sh starts one beside the tests, and a test that needs
# the tools runs this script too, which waits here until that install is done.
exec 9<scripts/setup-sam.sh  # (this script, from the repository's root, where it runs)
flock 9
if [ ! -x "$venv/bin/python" ]; then
  "$py" -m venv "$venv"
fi
# Keep the venv out of git without touching the repository's .gitignore.
[ -f "$venv/.gitignore" ] || echo '*' >"$venv/.gitignore"
stamp=$venv/.installed-$(echo "${packages[*]}" | sha256sum | cut -c1-12)
if [ ! -f "$stamp" ]; then
  echo "setup-sam: installing ${packages[*]} into $venv (about a minute)"
  log=$(mktemp)
  if ! { "$venv/bin/python" -m pip install -q --upgrade pip && "$venv/bin/python" -m pip install -q "${packages[@]}"; } >"$log" 2>&1; then
    cat "$log"; echo "setup-sam: pip install failed"; exit 1
  fi
  rm -f "$log"
  "$venv/bin/sam" --version >/dev/null   # fail loudly if the install did not take
  "$venv/bin/cfn-lint" --version >/dev/null
  rm -f "$venv"/.installed-*; touch "$stamp"
fi
