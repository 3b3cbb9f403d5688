"""Reset isolation of a browser sandbox, for real: Chromium in the browser image, on dockerd.

One episode's page writes everything a site can keep in a browser — a cookie, localStorage,
sessionStorage, IndexedDB — and changes the site's own state (a line added to the shop's
cart); the next episode, reset onto the same site and seed, finds none of it, and the site's state is
exactly a fresh site's. A request that an old episode's page still sends is answered 410 by the
sites' server and never reaches the new episode's app.
"""

from __future__ import annotations

import http.client
import json

import pytest

from environments.browser.sandbox.sites import shop
from environments.browser.task import BrowserTask
from sandboxes import SandboxSpec, create_sandbox

pytestmark = pytest.mark.docker

WRITE = """(async () => {
  document.cookie = 'probe=1; max-age=3600; path=/';
  localStorage.setItem('probe', '1');
  sessionStorage.setItem('probe', '1');
  await new Promise((ok, bad) => { const r = indexedDB.open('probe', 1);
    r.onupgradeneeded = () => r.result.createObjectStore('s'); r.onsuccess = () => { r.result.close(); ok(); };
    r.onerror = bad; });
  return true;
})()"""
READ = """(async () => ({cookie: document.cookie, local: localStorage.length, session: sessionStorage.length,
  idb: (await indexedDB.databases()).map(d => d.name), secure: window.isSecureContext}))()"""
EMPTY = {"cookie": "", "local": 0, "session": 0, "idb": [], "secure": False}
# The sites are plain-HTTP origins (not secure contexts), so the Cache API and service workers do not
# exist for their pages; everything a page can keep is written below.


def add_to_cart(product_id: int, options: dict[str, str]) -> str:
    form = json.dumps({"quantity": "1", **options})
    return f"""(async () => {{
      const r = await fetch('/product/{product_id}', {{method: 'POST', body: new URLSearchParams({form})}});
      return r.status;
    }})()"""


@pytest.fixture(scope="module")
def browser_sandbox(backend, sandbox_images):
    sandbox = create_sandbox(backend=backend, spec=SandboxSpec(image=sandbox_images["browser"], memory="2g",
                                                               pids=1024, max_lifetime_s=900))
    yield sandbox
    sandbox.destroy(reason="test done")


def shop_task(index: int) -> dict:
    return BrowserTask(family="site", navigation=True, **shop.generate_task(index)).driver_payload()


def test_a_reset_leaves_nothing_of_the_last_episode(browser_sandbox):
    session = browser_sandbox.browser()
    task = shop_task(0)
    fresh = shop.Site(task["site_seed"]).state()
    session.call("open", task=task)
    product = fresh["orders"][0]["lines"][0]  # a product the seeded history names, with valid options
    assert session.call("eval", expression=add_to_cart(product["product_id"], product["options"]))["value"] < 400
    assert session.call("eval", expression=WRITE)["value"] is True
    dirty = session.call("eval", expression=READ)["value"]
    assert dirty["local"] == 1 and dirty["idb"] == ["probe"] and "probe=1" in dirty["cookie"]
    assert len(session.call("state")["site"]["cart"]) == len(fresh["cart"]) + 1
    old_url = session.call("observe")["url"]

    reopened = session.call("open", task=task)  # the next episode: the same site, the same seed
    assert session.call("eval", expression=READ)["value"] == EMPTY
    assert session.call("state")["site"] == fresh
    assert reopened["url"].split("/")[2] != old_url.split("/")[2]  # a new origin for the new episode


def test_a_request_from_an_ended_episode_never_reaches_the_new_site():
    """The sites' server answers only the current episode's origin (checked without Docker, on the
    driver's own server)."""
    from environments.browser.sandbox.browserd import SiteServer

    server = SiteServer()
    try:
        server.generation, server.app = 2, shop.Site(4)

        def get(host: str, path: str = "/cart") -> int:
            connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
            connection.request("GET", path, headers={"Host": f"{host}:{server.port}"})
            status = connection.getresponse().status
            connection.close()
            return status

        assert get("e2.crucible.internal") == 200
        assert get("e1.crucible.internal") == 410  # the last episode's page
        assert get("127.0.0.1") == 410 and get("localhost") == 410
        assert get("e2.crucible.internal", "/miniwob/../../../../etc/passwd") == 404
        assert get("e2.crucible.internal", "/core/%2e%2e/%2e%2e/%2e%2e/etc/passwd") == 404
    finally:
        server.httpd.shutdown()
