#!/usr/bin/env bash
# Creates the Python virtual environment in which tests/firecracker_clients.rs
# runs PyPI's firecracker-python against teravm: target/fc-python-venv.
# The package pins its own dependencies (docker, requests,
# requests-unixsocket, tenacity, psutil, pyroute2, paramiko, faker).
set -euo pipefail
cd "$(dirname "$0")/../.."
venv=target/fc-python-venv
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
"$venv/bin/pip" install -q --disable-pip-version-check firecracker-python==0.0.5
"$venv/bin/python" -c 'import firecracker.api, firecracker.process' >/dev/null
echo "firecracker-python 0.0.5 ready in $venv"
