#!/usr/bin/python3
"""The coordinator's web page (coordinator/web/, served by coordinator/WebServer) loaded in
headless Chromium (Debian's `chromium`); the test reads the DOM Chromium rendered after the page's
scripts ran (--dump-dom) and keeps a screenshot.

    coordinator_web_test.py fixture --server BUILD/tests/web_fixture_server --work DIR
    coordinator_web_test.py live --clusterize BUILD/clusterize/clusterize --provider BUILD/node/provider --work DIR
    coordinator_web_test.py bad_address --clusterize BUILD/clusterize/clusterize --work DIR

CASE:
  fixture  web_fixture_server answers /api/state with a fixed state (two clusters, a spare, every
           history, the time split) in which volunteer text is hostile: a node named
           <img src=x onerror=...>, a state "<b>bold</b>", an event whose message is a <script>,
           an evaluation named with an <svg onload=...>. The rendered page must show each cluster
           as its chain of node boxes in Root → Leaf order with the names as text; each chart's
           canvas must report as many points (bars) as the state holds, counted by Chart.js; the
           hostile strings must appear as text and create no element (no img, b, svg, extra
           script; the title unchanged). Screenshot: DIR/live_view_fixture.png.

  live     a real coordinator (clusterize --serve --web 127.0.0.1:0) and 3 real volunteers
           (provider --join) train the Fashion-MNIST CNN as one 3-stage pipeline on loopback, with
           an evaluation every 10 steps. Once /api/state shows loss and evaluation records, the
           page is loaded while training goes on: the cluster's chain shows the three volunteers'
           names in Root → Leaf order, every node has its row, and each chart's canvas reports at
           least as many points as the state held before the page was loaded (and no more than it
           held after). /metrics answers Prometheus text. Screenshot: DIR/live_view.png (the one
           in docs/img/ is such a run). The run is stopped once the page is checked.

  bad_address  clusterize --serve --web with a taken port, an address not this machine's and
           malformed values: exit 2 with one line naming --web and the value, before the model
           is read.

Chromium runs with --virtual-time-budget, so the page's polls and chart layout happen in virtual
time; no sleep stands in for them.
"""
import argparse
import html.parser
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request

HOSTILE_NAME = "<img src=x onerror=\"document.title='PWNED'\">"
HOSTILE_STATE = "<b>bold</b>"
HOSTILE_MESSAGE = "</li><script>document.title='PWNED'</script>"
HOSTILE_EVAL = "<svg onload=\"document.title='PWNED'\">"
HOSTILE_RELAY = "<iframe src=\"javascript:document.title='PWNED'\">"


def fail(message):
    print("FAIL: " + message, file=sys.stderr)
    sys.exit(1)


class Element:
    def __init__(self, tag, attrs, parent):
        self.tag, self.attrs, self.parent, self.children = tag, dict(attrs), parent, []

    def text(self):
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)

    def walk(self):
        yield self
        for c in self.children:
            if isinstance(c, Element):
                yield from c.walk()

    def find_all(self, predicate):
        return [e for e in self.walk() if predicate(e)]

    def classes(self):
        return self.attrs.get("class", "").split()


class DomParser(html.parser.HTMLParser):
    """The serialised DOM as a tree of Elements (text unescaped, as the browser holds it)."""
    VOID = {"meta", "link", "br", "img", "input", "hr", "source", "wbr", "area", "base", "col",
            "embed", "param", "track"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.root = Element("#document", [], None)
        self.current = self.root

    def handle_starttag(self, tag, attrs):
        element = Element(tag, attrs, self.current)
        self.current.children.append(element)
        if tag not in self.VOID:
            self.current = element

    def handle_startendtag(self, tag, attrs):
        self.current.children.append(Element(tag, attrs, self.current))

    def handle_endtag(self, tag):
        node = self.current
        while node is not None and node.tag != tag:
            node = node.parent
        if node is not None and node.parent is not None:
            self.current = node.parent

    def handle_data(self, data):
        self.current.children.append(data)


def chromium_binary():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    fail("no chromium on PATH (tools/setup.sh installs Debian's chromium)")


def render(url, work, screenshot):
    """One headless Chromium run: the DOM after the scripts ran, and a screenshot."""
    profile = os.path.join(work, "chromium_profile")
    shutil.rmtree(profile, ignore_errors=True)
    cmd = [chromium_binary(), "--headless", "--disable-gpu", "--no-sandbox", "--no-first-run",
           "--disable-extensions", "--disable-background-networking", "--disable-sync",
           "--hide-scrollbars", f"--user-data-dir={profile}", "--window-size=1400,1500",
           # Virtual time: enough for the page's first two polls (every 2 s) and the charts.
           "--virtual-time-budget=4500", f"--screenshot={screenshot}", "--dump-dom", url]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    if result.returncode != 0 or "<html" not in result.stdout:
        fail(f"chromium exited {result.returncode}: {result.stderr[-2000:]}")
    parser = DomParser()
    parser.feed(result.stdout)
    return parser.root, result.stdout


def fixture_state():
    def history(n, f):
        return [[s, f(s)] for s in range(1, n + 1)]
    nodes = [
        {"name": "node_0", "cluster": 0, "stage": 0, "role": "root", "state": "running",
         "address": "127.0.0.1:7001", "heartbeat_age_s": 0.4, "step": 40, "compute_s": 0.031,
         "send_s": 0.004, "wait_s": 0.012},
        {"name": HOSTILE_NAME, "cluster": 0, "stage": 1, "role": "stem", "state": HOSTILE_STATE,
         "address": "127.0.0.1:7002", "heartbeat_age_s": 1.2, "step": 40, "compute_s": 0.027,
         "send_s": 0.006, "wait_s": 0.015},
        {"name": "node_2", "cluster": 0, "stage": 2, "role": "leaf", "state": "paused",
         "address": "127.0.0.1:7003", "heartbeat_age_s": 0.2, "step": 40, "compute_s": 0.022,
         "send_s": 0.001, "wait_s": 0.03},
        {"name": "node_3", "cluster": 1, "stage": 0, "role": "whole", "state": "lost",
         "address": "127.0.0.1:7004", "heartbeat_age_s": 31.0, "step": 35, "compute_s": 0.07,
         "send_s": None, "wait_s": 0.002},
        {"name": "node_4", "cluster": None, "stage": None, "role": "spare", "state": "spare",
         "address": "127.0.0.1:7005", "heartbeat_age_s": 0.9, "step": 0, "compute_s": None,
         "send_s": None, "wait_s": None},
    ]
    clusters = [
        {"id": 0, "nodes": ["node_0", HOSTILE_NAME, "node_2"], "step": 40, "max_steps": 100,
         "loss": 0.61, "samples_per_s": 512.5, "eta_s": 75.0,
         "loss_history": history(40, lambda s: 2.3 / (1 + 0.05 * s)),
         "eval_history": [[20, "accuracy", 0.61], [40, "accuracy", 0.72], [20, HOSTILE_EVAL, 0.9],
                          [40, HOSTILE_EVAL, 0.7]],
         "throughput_history": history(40, lambda s: 480 + s)},
        {"id": 1, "nodes": ["node_3"], "step": 35, "max_steps": None, "loss": None,
         "samples_per_s": None, "eta_s": None,
         "loss_history": history(35, lambda s: 2.3 / (1 + 0.04 * s)),
         "eval_history": [[20, "accuracy", 0.55]],
         "throughput_history": history(35, lambda s: 300 - s)},
    ]
    events = [
        {"t": 1700000010, "node": "node_0", "kind": "joined", "message": "joined as node_0"},
        {"t": 1700000020, "node": HOSTILE_NAME, "kind": "left", "message": HOSTILE_MESSAGE},
        {"t": 1700000030, "node": "node_3", "kind": "lost", "message": "no heartbeat for 30 s"},
    ]
    state = {"run": {"phase": "training", "now": 1700000100, "started_at": 1700000000,
                     "num_clusters": 2, "members": 5, "records": 155, "dropped": 0},
             "clusters": clusters, "nodes": nodes, "events": events,
             # The links by how they are made, a volunteer's relay (a hostile name) and the
             # coordinator's (VolunteerRelays.h linksView and figures, CoordinatorRelay figures).
             "links": {"direct": 2, "dial_out": 1, "relayed": 2, "not_direct": [
                 {"a": "node_0", "b": HOSTILE_NAME, "via": "dial-out"},
                 {"a": "node_2", "b": "node_3", "via": HOSTILE_RELAY},
                 {"a": "node_0", "b": "node_3", "via": "coordinator"}]},
             "relays": [{"name": HOSTILE_RELAY, "address": "10.0.0.5:7300", "alive": False, "links": 1,
                         "messages_forwarded": 10, "bytes_forwarded": 5000000, "bytes_waiting": 250000,
                         "refused": 1}],
             "relay": {"messages_forwarded": 3, "bytes_forwarded": 2000000, "bytes_waiting": 0,
                       "links": [{"from": "node_0", "to": "node_3", "bytes": 2000000}],
                       "refused": {"unplanned": 2, "over_budget": 1}}}
    return state


# What the page's Links section must show for fixture_state(): the summary line, the links that
# are not direct (between, and, via) and each relay's row.
FIXTURE_LINKS_SUMMARY = "2 direct, 1 opened by a dial-out-only volunteer, 2 relayed"
FIXTURE_RELAY_ROWS = {HOSTILE_RELAY: [HOSTILE_RELAY, "10.0.0.5:7300", "lost", "1", "5.0", "10", "0.3", "1"],
                      "coordinator": ["coordinator", "(--relay)", "yes", "1", "2.0", "3", "0.0", "3"]}


def check_links_section(by_id, root, state):
    summary = by_id.get("links-summary")
    if summary is None or summary.text() != FIXTURE_LINKS_SUMMARY:
        fail(f"links summary {summary.text() if summary else None!r}, expected {FIXTURE_LINKS_SUMMARY!r}")
    rows = by_id["links"].find_all(lambda e: e.tag == "tr")[1:]  # after the header
    shown = [[c.text() for c in r.children if isinstance(c, Element)] for r in rows]
    want = [[l["a"], l["b"], l["via"]] for l in state["links"]["not_direct"]]
    if shown != want:
        fail(f"links table {shown}, expected {want}")
    for name, cells in FIXTURE_RELAY_ROWS.items():
        found = root.find_all(lambda e, name=name: e.tag == "tr" and e.attrs.get("data-relay") == name)
        got = [c.text() for c in found[0].children if isinstance(c, Element)] if len(found) == 1 else found
        if got != cells:
            fail(f"relay {name!r}: row {got}, expected {cells}")
    print(f"links: {summary.text()}; {len(rows)} not direct listed; relays {list(FIXTURE_RELAY_ROWS)}")


def check_page(root, raw, state, expect_polls=1):
    by_id = {e.attrs["id"]: e for e in root.walk() if "id" in e.attrs}
    status = by_id.get("status")
    if status is None or status.attrs.get("data-ok") != "true" or \
            int(status.attrs.get("data-polls", "0")) < expect_polls:
        fail(f"the page did not draw a state: #status {status.attrs if status else None}")
    if root.find_all(lambda e: e.tag == "title")[0].text() != "cairn: live run":
        fail("the page's title changed: a volunteer's text ran as script")
    # Each cluster is a chain of node boxes in Root → Leaf order, names as text.
    for cluster in state["clusters"]:
        blocks = root.find_all(lambda e: e.attrs.get("data-cluster") == str(cluster["id"]))
        if len(blocks) != 1:
            fail(f"cluster {cluster['id']}: {len(blocks)} blocks on the page")
        boxes = blocks[0].find_all(lambda e: "node" in e.classes() and "data-node" in e.attrs)
        names = [b.attrs["data-node"] for b in boxes]
        if names != cluster["nodes"]:
            fail(f"cluster {cluster['id']}: chain {names}, expected {cluster['nodes']}")
        for box, name in zip(boxes, cluster["nodes"]):
            shown = "".join(c for c in box.children if isinstance(c, str))
            if shown != name:
                fail(f"cluster {cluster['id']}: a node box shows {shown!r}, expected {name!r}")
        print(f"cluster {cluster['id']}: chain {' → '.join(names)}")
    spares = [n["name"] for n in state["nodes"] if n["role"] == "spare"]
    spare_blocks = root.find_all(lambda e: e.attrs.get("data-cluster") == "spares")
    if spares and (len(spare_blocks) != 1 or [b.attrs["data-node"] for b in spare_blocks[0].find_all(
            lambda e: "data-node" in e.attrs)] != spares):
        fail(f"the spares {spares} are not shown as such")
    # Node states map to fixed classes: the hostile one is "other", the known ones theirs.
    expected_class = {"running": "state-ok", "paused": "state-wait", "lost": "state-bad",
                      "spare": "state-spare", HOSTILE_STATE: "state-other"}
    for n in state["nodes"]:
        rows = root.find_all(lambda e: e.tag == "tr" and e.attrs.get("data-node") == n["name"])
        if len(rows) != 1:
            fail(f"node {n['name']!r}: {len(rows)} rows in the nodes table")
        cells = [c for c in rows[0].children if isinstance(c, Element)]
        if cells[0].text() != n["name"] or cells[4].text() != n["state"] or \
                expected_class[n["state"]] not in cells[4].classes():
            fail(f"node {n['name']!r}: row {[c.text() for c in cells]} (state class "
                 f"{cells[4].classes()})")
    # Charts: Chart.js's own count of laid-out points (bars) per canvas.
    clusters = state["clusters"]
    expected_points = {
        "chart-loss": sum(len(c["loss_history"]) for c in clusters),
        "chart-eval": sum(len(c["eval_history"]) for c in clusters),
        "chart-throughput": sum(len(c["throughput_history"]) for c in clusters),
        "chart-split": 3 * sum(1 for n in state["nodes"]
                               if any(isinstance(n.get(k), (int, float)) for k in
                                      ("compute_s", "send_s", "wait_s"))),
    }
    for chart, expected in expected_points.items():
        canvas = by_id.get(chart)
        got = int(canvas.attrs.get("data-points", "-1")) if canvas is not None else None
        if got != expected:
            fail(f"{chart}: {got} points drawn, expected {expected}")
        print(f"{chart}: {got} points drawn")
    if "links" in state:
        check_links_section(by_id, root, state)
    # Events: newest first, texts verbatim.
    items = by_id["events"].find_all(lambda e: e.tag == "li")
    messages = [i.find_all(lambda e: "message" in e.classes())[0].text() for i in items]
    if messages != [e["message"] for e in reversed(state["events"])]:
        fail(f"events shown {messages}")
    # Hostile text creates no element: no img/b/svg anywhere, and the only scripts are the page's.
    for tag in ("img", "b", "svg", "iframe", "object"):
        if root.find_all(lambda e, tag=tag: e.tag == tag):
            fail(f"a <{tag}> element is on the page: volunteer text became markup")
    scripts = [e.attrs.get("src") for e in root.find_all(lambda e: e.tag == "script")]
    if scripts != ["/chart.js", "/app.js"]:
        fail(f"scripts on the page: {scripts}")
    for text in (HOSTILE_NAME, HOSTILE_STATE, HOSTILE_MESSAGE) + ((HOSTILE_RELAY,) if "links" in state else ()):
        if text not in root.text():
            fail(f"{text!r} is not shown as text")
    if "PWNED" in raw.split("<title>")[1].split("</title>")[0]:
        fail("a volunteer's script ran")
    print("hostile names, states and messages are shown as text and created no element")


def check_screenshot(path):
    from PIL import Image
    if not os.path.exists(path):
        fail(f"no screenshot at {path}")
    image = Image.open(path).convert("RGB")
    # The charts' first colour (#2563eb, the loss line and compute bars) must be drawn.
    blue = sum(1 for p in image.getdata() if p == (0x25, 0x63, 0xeb))
    if image.size != (1400, 1500) or blue < 500:
        fail(f"screenshot {path}: size {image.size}, {blue} pixels of the charts' blue")
    print(f"screenshot {path}: {image.size[0]}x{image.size[1]}, {blue} pixels of chart blue")


def case_fixture(args):
    os.makedirs(args.work, exist_ok=True)
    state = fixture_state()
    state_path = os.path.join(args.work, "state.json")
    with open(state_path, "w") as f:
        json.dump(state, f)
    server = subprocess.Popen([args.server, "--state", state_path], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline()
        if not line.startswith("serving http://"):
            fail(f"web_fixture_server printed {line!r}")
        url = line.split()[1]
        screenshot = os.path.join(args.work, "live_view_fixture.png")
        root, raw = render(url, args.work, screenshot)
        check_page(root, raw, state, expect_polls=2)
        check_screenshot(screenshot)
    finally:
        server.stdin.close()  # web_fixture_server stops when its input closes
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            fail("web_fixture_server did not stop when its input closed")
    if server.returncode != 0:
        fail(f"web_fixture_server exited {server.returncode}")


def fetch(url):
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.headers.get("Content-Type"), response.read().decode()


def case_live(args):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import volunteer_harness as vt  # its coordinator/volunteer helpers (and its Fashion-MNIST job)
    shutil.rmtree(args.work, ignore_errors=True)
    # Long enough that training is still going when the page is checked; stopped after that.
    run = vt.start_run(args, 5000, 200, ["--min-volunteers", "3", "--clusters", "1", "--cuts", "7,14",
                                         "--web", "127.0.0.1:0", "--view-every-s", "0"], 3, {"eval_every": 10})
    with run:
        line = run.coordinator.wait_for(lambda l: l.startswith("web view: http://"), 10, "'web view: URL'")
        url = line.split()[2]
        run.join(3)
        run.wait_planned(1, 120, "'planned 1 cluster(s)'")
        # Wait (bounded) until the state holds loss and evaluation records of the placed cluster,
        # and each of its 3 volunteers' credit.
        deadline = time.monotonic() + 180
        while True:
            _, body = fetch(url + "api/state")
            before = json.loads(body)
            c = before["clusters"][0] if before["clusters"] else {}
            if len(c.get("loss_history", [])) >= 10 and c.get("eval_history") and \
                    len(c.get("nodes", [])) == 3 and len(before.get("credit", [])) == 3:
                break
            if time.monotonic() > deadline:
                fail(f"no loss and evaluation records at {url}api/state after 180 s: {body[:2000]}")
            time.sleep(0.5)  # polling a condition, as the page itself does
        screenshot = os.path.join(args.work, "live_view.png")
        root, raw = render(url, args.work, screenshot)
        _, body = fetch(url + "api/state")
        after = json.loads(body)
        check_live_page(root, before, after)
        check_screenshot(screenshot)
        content_type, metrics = fetch(url + "metrics")
        if not content_type.startswith("text/plain; version=0.0.4") or "cairn_" not in metrics:
            fail(f"/metrics answered {content_type}: {metrics[:500]}")
        print(f"/metrics: {len(metrics.splitlines())} lines of Prometheus text")


def case_bad_address(args):
    """--web that cannot be bound or parsed: exit 2 and one line naming the flag and the value,
    before the model is even read (the model path given does not exist)."""
    import socket
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    cases = [(str(port), f"--web 127.0.0.1:{port}: cannot listen there"),
             (f"127.0.0.1:{port}", f"--web 127.0.0.1:{port}: cannot listen there"),
             ("192.0.2.1:0", "--web 192.0.2.1:0: cannot listen there"),  # not this machine's
             ("localhost", '--web must be PORT (127.0.0.1 only) or HOST:PORT, e.g. 8080 or 0.0.0.0:8080; got "localhost"'),
             ("999999", '--web must be PORT (127.0.0.1 only) or HOST:PORT'),
             ("127.0.0.1:70000", '--web must be HOST:PORT')]
    for value, expected in cases:
        result = subprocess.run([args.clusterize, "--model", "/nonexistent/model.pt", "--input-shape",
                                 "1,1", "--serve", "127.0.0.1:0", "--web", value,
                                 "--out", os.path.join(args.work, "unused")],
                                capture_output=True, text=True, timeout=60)
        lines = result.stderr.strip().splitlines()
        if result.returncode != 2 or len(lines) != 1 or expected not in lines[0]:
            fail(f"--web {value}: exit {result.returncode}, stderr {result.stderr!r}; expected exit 2 "
                 f"and one line with {expected!r}")
        print(f"--web {value}: exit 2, {lines[0]}")
    taken.close()


def check_live_page(root, before, after):
    by_id = {e.attrs["id"]: e for e in root.walk() if "id" in e.attrs}
    if by_id["status"].attrs.get("data-ok") != "true":
        fail(f"the page did not draw a state: {by_id['status'].attrs}")
    cluster = before["clusters"][0]
    blocks = root.find_all(lambda e: e.attrs.get("data-cluster") == str(cluster["id"]))
    names = [b.attrs["data-node"] for b in blocks[0].find_all(
        lambda e: "node" in e.classes() and "data-node" in e.attrs)] if blocks else None
    if names != cluster["nodes"]:
        fail(f"cluster {cluster['id']}: the page's chain is {names}, the state's {cluster['nodes']}")
    print(f"cluster {cluster['id']}: chain {' → '.join(names)}")
    for n in after["nodes"]:
        if not root.find_all(lambda e, n=n: e.tag == "tr" and e.attrs.get("data-node") == n["name"]):
            fail(f"node {n['name']} has no row")
    def count(state, key):  # the entries with a number to plot (a loss may be null)
        return sum(1 for c in state["clusters"] for e in c[key]
                   if isinstance(e[-1], (int, float)) and not isinstance(e[-1], bool))
    for chart, key in (("chart-loss", "loss_history"), ("chart-eval", "eval_history"),
                       ("chart-throughput", "throughput_history")):
        drawn = int(by_id[chart].attrs.get("data-points", "-1"))
        if not count(before, key) <= drawn <= count(after, key) or drawn == 0:
            fail(f"{chart}: {drawn} points drawn; the state held {count(before, key)} before the "
                 f"page loaded and {count(after, key)} after")
        print(f"{chart}: {drawn} points drawn ({count(before, key)}..{count(after, key)} in the state)")
    bars = int(by_id["chart-split"].attrs.get("data-points", "-1"))
    if bars < 3:
        fail(f"chart-split: {bars} bars, expected compute/send/wait for the placed nodes")
    # Credit: a row per (volunteer, node) the state credited before the page loaded, with at least
    # that many kept steps (coordinator/Credit.h).
    if not before.get("credit"):
        fail("the state credits nobody although the volunteers train")
    for c in before["credit"]:
        rows = root.find_all(lambda e, c=c: e.tag == "tr" and e.attrs.get("data-volunteer") == c["volunteer"]
                             and e.attrs.get("data-credit-node") == c["node"])
        cells = [x for x in rows[0].children if isinstance(x, Element)] if len(rows) == 1 else []
        if not cells or cells[2].text() != c["node"] or int(cells[3].text()) < c["steps"]:
            fail(f"credit of {c['volunteer']} for {c['node']}: rows {[[x.text() for x in cells]]}, "
                 f"the state had {c['steps']} steps")
    print(f"credit: {len(before['credit'])} row(s) drawn, e.g. {before['credit'][0]['volunteer']} "
          f"{before['credit'][0]['node']}: {before['credit'][0]['steps']}+ steps")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("case", choices=["fixture", "live", "bad_address"])
    parser.add_argument("--server", help="web_fixture_server (case fixture)")
    parser.add_argument("--clusterize", help="clusterize (case live)")
    parser.add_argument("--provider", help="provider (case live)")
    parser.add_argument("--work", required=True)
    args = parser.parse_args()
    os.makedirs(args.work, exist_ok=True)
    {"fixture": case_fixture, "live": case_live, "bad_address": case_bad_address}[args.case](args)
    print("PASS")


if __name__ == "__main__":
    main()
