#!/usr/bin/env bash
# Makes the Python environment of the reference tests: .cache/test-venv with the packages in
# tests/requirements.txt from PyPI (the formats' own readers and writers, to test mxtrain's
# against). Safe to run twice: it reinstalls only when the requirements change.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.cache/test-venv
stamp=$venv/requirements.txt
if [ -f "$stamp" ] && cmp -s tests/requirements.txt "$stamp"; then exit 0; fi
if ! python3 -c 'import ensurepip' 2>/dev/null; then
  echo "python_env: installing python3-venv"
  sudo_cmd=(); [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
fi
echo "python_env: making $venv (tests/requirements.txt)"
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r tests/requirements.txt
cp tests/requirements.txt "$stamp"
