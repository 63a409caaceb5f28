#!/usr/bin/env python3
# trace-screenshot.py URL OUT.png SECONDS [X Y]: loads URL in the chromium that listens on
# 127.0.0.1:9222 (tools/trace-screenshot.sh starts it), waits, dismisses a cookie banner, clicks
# at X Y if given, and saves a PNG of the page.
import json, sys, time, base64, urllib.request, websocket
url, out, wait = sys.argv[1], sys.argv[2], float(sys.argv[3])
tabs = json.load(urllib.request.urlopen("http://127.0.0.1:9222/json"))
tab = [t for t in tabs if t.get("type") == "page"][0]
ws = websocket.create_connection(tab["webSocketDebuggerUrl"], suppress_origin=True)
n = [0]
def call(method, **params):
    n[0] += 1
    ws.send(json.dumps({"id": n[0], "method": method, "params": params}))
    while True:
        m = json.loads(ws.recv())
        if m.get("id") == n[0]:
            return m.get("result", m)
call("Emulation.setDeviceMetricsOverride", width=1600, height=1150, deviceScaleFactor=1, mobile=False)
call("Page.enable")
call("Page.navigate", url=url)
time.sleep(wait)
call("Runtime.evaluate", expression="[...document.querySelectorAll('button')].filter(b => b.textContent.trim() == 'OK').forEach(b => b.click())")
time.sleep(1)
if len(sys.argv) > 5:  # click at x y: select a slice, its args show below
    x, y = float(sys.argv[4]), float(sys.argv[5])
    for t in ("mouseMoved", "mousePressed", "mouseReleased"):
        call("Input.dispatchMouseEvent", type=t, x=x, y=y, button="left", clickCount=1)
    time.sleep(3)
r = call("Page.captureScreenshot", format="png")
open(out, "wb").write(base64.b64decode(r["data"]))
print("wrote", out)
