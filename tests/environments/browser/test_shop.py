"""The shop site: the real app over real HTTP (a stdlib server in the test calling `Site.handle`, as the
sandbox driver does), scripted solutions that earn 1.0, every gaming strategy scoring below them, hostile
input answered by 4xx pages, determinism across processes, and one page parsed by the real Chromium.

    .venv/bin/pytest -q -p no:cacheprovider tests/environments/browser/test_shop.py
"""

from __future__ import annotations

import html
import http.client
import json
import os
import random
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.cookies import SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

import pytest

from environments.browser.sandbox.sites import shop

REPO = Path(__file__).resolve().parents[3]
SAMPLE = [*range(36), 997, 4242, 4999, 123_456]  # six of every family, and a few far indices


class _Adapter(BaseHTTPRequestHandler):
    """What the in-sandbox driver does: parse the request, call `Site.handle`, send its answer."""

    def _serve(self) -> None:
        url = urlsplit(self.path)
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        cookies = {key: morsel.value for key, morsel in SimpleCookie(self.headers.get("Cookie", "")).items()}
        status, headers, payload = self.server.site.handle(  # type: ignore[attr-defined]
            self.command, unquote(url.path), parse_qs(url.query, keep_blank_values=True),
            parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True), cookies)
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_HEAD = _serve

    def log_message(self, format: str, *args: Any) -> None:
        pass


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    text: str


class Client:
    def __init__(self, server: ThreadingHTTPServer) -> None:
        self.server = server
        self.port = server.server_address[1]

    @property
    def site(self) -> shop.Site:
        return self.server.site  # type: ignore[attr-defined,no-any-return]

    def request(self, method: str, path: str, fields: list[tuple[str, str]] | None = None) -> Reply:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        body = urlencode(fields or []).encode()
        headers = {"Content-Type": "application/x-www-form-urlencoded"} if fields is not None else {}
        connection.request(method, path, body=body if fields is not None else None, headers=headers)
        response = connection.getresponse()
        reply = Reply(response.status, dict(response.getheaders()), response.read().decode())
        connection.close()
        return reply

    def get(self, path: str) -> Reply:
        return self.request("GET", path)

    def post(self, path: str, fields: list[tuple[str, str]]) -> Reply:
        """A form submission, following the 303 the way the browser does."""
        reply = self.request("POST", path, fields)
        if reply.status == 303:
            return self.get(reply.headers["Location"])
        return reply


@pytest.fixture(scope="module")
def server() -> Iterator[ThreadingHTTPServer]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Adapter)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def open_task(server: ThreadingHTTPServer, index: int) -> tuple[Client, dict[str, Any]]:
    """A fresh site for task `index`, as the driver makes on every reset."""
    task = shop.generate_task(index)
    server.site = shop.Site(task["site_seed"])  # type: ignore[attr-defined]
    return Client(server), task


# -- scripted actions -----------------------------------------------------------------------------
def label(line: dict[str, Any]) -> str:
    return f"{line['name']} ({shop.describe_options(line['options'])})"


def add(client: Client, line: dict[str, Any]) -> Reply:
    fields = [*line["options"].items(), ("quantity", str(line["quantity"]))]
    reply = client.post(f"/product/{line['product_id']}", fields)
    assert reply.status == 200, reply.text
    return reply


def cart_lines(client: Client) -> dict[str, tuple[int, int]]:
    """The cart page read as a shopper reads it: label -> (line id, quantity)."""
    page = client.get("/cart").text
    found = re.findall(r'action="/cart/line/(\d+)/quantity"><input name="quantity" type="number" min="1" '
                       r'max="20" value="(\d+)" aria-label="Quantity of ([^"]*)"', page)
    return {html.unescape(what): (int(line), int(quantity)) for line, quantity, what in found}


def fill_cart(client: Client, lines: list[dict[str, Any]]) -> None:
    """Bring the cart to exactly `lines`: remove, re-quantify and add through the pages."""
    wanted = {label(line): line for line in lines}
    for what, (line_id, quantity) in cart_lines(client).items():
        if what not in wanted:
            assert client.post(f"/cart/line/{line_id}/remove", []).status == 200
        elif quantity != wanted[what]["quantity"]:
            reply = client.post(f"/cart/line/{line_id}/quantity", [("quantity", str(wanted[what]["quantity"]))])
            assert reply.status == 200
    present = cart_lines(client)
    for what, line in wanted.items():
        if what not in present:
            add(client, line)
    assert {what: quantity for what, (_, quantity) in cart_lines(client).items()} == {
        what: line["quantity"] for what, line in wanted.items()}


def checkout_token(client: Client) -> str:
    page = client.get("/checkout").text
    return re.search(r'name="token" value="(\d+)"', page).group(1)  # type: ignore[union-attr]


def checkout(client: Client, shipping: dict[str, str], token: str | None = None) -> Reply:
    fields = [("token", token if token is not None else checkout_token(client)),
              *((key, shipping[key]) for key in shop.SHIPPING_FIELDS)]
    return client.post("/checkout", fields)


def solve(client: Client, task: dict[str, Any]) -> Reply:
    fill_cart(client, task["check"]["lines"])
    reply = checkout(client, task["check"]["shipping"])
    assert reply.status == 200 and "Thank you! Your order has been placed." in reply.text, reply.text
    return reply


def score(client: Client, task: dict[str, Any]) -> float:
    reward, reason = shop.verify(task["check"], client.site.state())
    assert isinstance(reason, str) and reason and "\n" not in reason
    return reward


# -- solving ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("index", SAMPLE)
def test_scripted_solution_earns_one(server: ThreadingHTTPServer, index: int) -> None:
    client, task = open_task(server, index)
    assert set(task) == {"site", "site_seed", "goal", "check", "start_path"} and task["site"] == "shop"
    assert client.get(task["start_path"]).status == 200
    assert score(client, task) == 0.0
    page = solve(client, task)
    assert score(client, task) == 1.0
    for line in task["check"]["lines"]:  # the confirmation shows what was ordered
        assert html.escape(line["name"]) in page.text
    placed = [o for o in client.site.state()["orders"] if not o["seeded"]]
    assert len(placed) == 1 and placed[0]["shipping"] == task["check"]["shipping"]


def listing(client: Client, slug: str, sort: str) -> list[tuple[int, int, str]]:
    page = client.get(f"/category/{slug}?sort={sort}").text
    found = re.findall(r'<li><a href="/product/(\d+)">[^<]*</a>: \$(\d+)\.(\d\d)\. ([^<]*)</li>', page)
    return [(int(pid), int(dollars) * 100 + int(cents), options) for pid, dollars, cents, options in found]


@pytest.mark.parametrize("index", range(60))
def test_goal_is_answerable_from_the_pages(server: ThreadingHTTPServer, index: int) -> None:
    """The target the check names is the one a shopper finds by reading the pages the goal points to."""
    client, task = open_task(server, index)
    goal, check = task["goal"], task["check"]
    target = check["lines"][0]
    if check["family"] == "cheapest":
        extreme, singular, colour = re.match(r"Find the (cheapest|most expensive) (.+?) that comes in (\w+) ",
                                             goal).groups()  # type: ignore[union-attr]
        category = next(c for c in shop.CATEGORIES if c.singular == singular)
        sort = "price_asc" if extreme == "cheapest" else "price_desc"
        offering = [pid for pid, _, options in listing(client, category.slug, sort)
                    if colour in re.search(r"Colour: ([^;]*)", options).group(1).split(", ")]  # type: ignore[union-attr]
        assert offering[0] == target["product_id"]
    elif check["family"] == "priciest_under":
        singular, limit = re.match(r"Order the most expensive (.+?) that costs less than \$([\d.]+):",
                                   goal).groups()  # type: ignore[union-attr]
        category = next(c for c in shop.CATEGORIES if c.singular == singular)
        under = [pid for pid, cents, _ in listing(client, category.slug, "price_desc")
                 if cents < round(float(limit) * 100)]
        assert under[0] == target["product_id"]
    elif check["family"] == "description":
        feature = re.search(r'mentions "([^"]+)"', goal).group(1)  # type: ignore[union-attr]
        found = re.findall(r'<li><a href="/product/(\d+)">', client.get(f"/search?{urlencode({'q': feature})}").text)
        assert found == [str(target["product_id"])]
    elif check["family"] == "reorder":
        number = re.search(r"order #(\d+)", goal).group(1)  # type: ignore[union-attr]
        page = html.unescape(client.get(f"/order/{number}").text)
        for line in check["lines"]:
            assert f"{line['name']}</a></td><td>{shop.describe_options(line['options'])}</td>" in page
        if "same address" in goal:
            assert all(check["shipping"][key] in page for key in ("full_name", "street", "city", "postcode"))
    elif check["family"] == "cart_edit":  # the line to keep is the one the goal does not name
        start = cart_lines(client)
        kept = [what for what in start if what.split(" (")[0] not in goal]
        assert len(start) == 3 and kept == [label(check["lines"][0])]
        assert start[kept[0]][1] == check["lines"][0]["quantity"]
        assert all(line["name"] in goal for line in check["lines"][1:])
    else:
        assert all(f"{line['quantity']} of the {label(line)}" in goal for line in check["lines"])
    if "same address" not in goal:
        assert f"postcode {check['shipping']['postcode']}, {check['shipping']['country']}" in goal


# -- gaming: nothing beats the exact answer --------------------------------------------------------
FAMILY_INDICES = range(6)  # one task of each family


def other_value(line: dict[str, Any], site: shop.Site) -> dict[str, str]:
    product = next(p for p in site.catalogue if p.id == line["product_id"])
    name, _, values = product.options[0]
    return {**line["options"], name: next(v for v in values if v != line["options"][name])}


@pytest.mark.parametrize("index", FAMILY_INDICES)
def test_no_order_and_over_ordering_score_zero(server: ThreadingHTTPServer, index: int) -> None:
    client, task = open_task(server, index)
    assert shop.verify(task["check"], client.site.state()) == (0.0, "no order was placed")
    doubled = [{**line, "quantity": line["quantity"] * 2} for line in task["check"]["lines"]]
    fill_cart(client, doubled)
    checkout(client, task["check"]["shipping"])
    assert score(client, task) == 0.0

    client, task = open_task(server, index)  # everything in the shop, the target lines included
    wanted = {line["product_id"] for line in task["check"]["lines"]}
    everything = task["check"]["lines"] + [
        {"product_id": p.id, "name": p.name, "quantity": 1, "options": {n: v[0] for n, _, v in p.options}}
        for p in client.site.catalogue if p.id not in wanted][:25]
    fill_cart(client, everything)
    checkout(client, task["check"]["shipping"])
    assert score(client, task) == 0.0


@pytest.mark.parametrize("index", FAMILY_INDICES)
def test_a_second_order_scores_zero(server: ThreadingHTTPServer, index: int) -> None:
    client, task = open_task(server, index)
    solve(client, task)
    solve(client, task)  # the exact answer twice
    reward, reason = shop.verify(task["check"], client.site.state())
    assert reward == 0.0 and "2 orders were placed" in reason

    client, task = open_task(server, index)  # the exact answer, then one unrelated extra order
    solve(client, task)
    extra = client.site.catalogue[0]
    add(client, {"product_id": extra.id, "quantity": 1, "options": {n: v[0] for n, _, v in extra.options}})
    checkout(client, task["check"]["shipping"])
    assert score(client, task) == 0.0


@pytest.mark.parametrize("index", FAMILY_INDICES)
def test_wrong_option_or_missing_line_scores_zero(server: ThreadingHTTPServer, index: int) -> None:
    client, task = open_task(server, index)
    lines = [dict(line) for line in task["check"]["lines"]]
    lines[0]["options"] = other_value(lines[0], client.site)
    fill_cart(client, lines)
    checkout(client, task["check"]["shipping"])
    assert score(client, task) == 0.0

    client, task = open_task(server, index)
    fill_cart(client, task["check"]["lines"][:-1] or [{**task["check"]["lines"][0], "quantity": 4}])
    checkout(client, task["check"]["shipping"])
    assert score(client, task) == 0.0


@pytest.mark.parametrize("field", shop.SHIPPING_FIELDS)
def test_wrong_shipping_scores_half(server: ThreadingHTTPServer, field: str) -> None:
    client, task = open_task(server, 3)
    shipping = dict(task["check"]["shipping"])
    choices = {"country": shop.COUNTRIES, "method": [m for m, _, _ in shop.SHIPPING_METHODS]}
    shipping[field] = next((c for c in choices.get(field, ()) if c != shipping[field]), "12345 X")
    fill_cart(client, task["check"]["lines"])
    assert checkout(client, shipping).status == 200
    reward, reason = shop.verify(task["check"], client.site.state())
    assert reward == 0.5 and field in reason


def test_shipping_text_compares_without_case_or_extra_spaces(server: ThreadingHTTPServer) -> None:
    client, task = open_task(server, 3)
    shipping = {key: f"  {value.upper()}  " if key not in ("country", "method") else value
                for key, value in task["check"]["shipping"].items()}
    shipping["street"] = shipping["street"].replace(" ", "   ")
    fill_cart(client, task["check"]["lines"])
    checkout(client, shipping)
    assert score(client, task) == 1.0


def test_an_order_is_a_snapshot(server: ThreadingHTTPServer) -> None:
    """Editing the cart after checkout neither spoils a right order nor repairs a wrong one."""
    client, task = open_task(server, 3)
    solve(client, task)
    add(client, {**task["check"]["lines"][0], "quantity": 5})
    assert score(client, task) == 1.0

    client, task = open_task(server, 3)
    fill_cart(client, [{**line, "quantity": line["quantity"] + 1} for line in task["check"]["lines"]])
    checkout(client, task["check"]["shipping"])
    fill_cart(client, task["check"]["lines"])  # the right cart, but never checked out
    assert score(client, task) == 0.0


def test_resubmitting_a_checkout_form_places_one_order(server: ThreadingHTTPServer) -> None:
    client, task = open_task(server, 2)
    fill_cart(client, task["check"]["lines"])
    token = checkout_token(client)
    first = checkout(client, task["check"]["shipping"], token)
    again = checkout(client, task["check"]["shipping"], token)  # back button, submit again
    assert first.text == again.text
    assert score(client, task) == 1.0


def test_a_stale_checkout_form_is_refused(server: ThreadingHTTPServer) -> None:
    client, task = open_task(server, 2)
    fill_cart(client, task["check"]["lines"])
    token = checkout_token(client)
    add(client, task["check"]["lines"][0])  # the cart changes after the checkout page was opened
    reply = checkout(client, task["check"]["shipping"], token)
    assert reply.status == 409 and "cart changed" in reply.text
    assert [o for o in client.site.state()["orders"] if not o["seeded"]] == []
    for bad in ("", "999", "x" * 200):
        assert checkout(client, task["check"]["shipping"], bad).status == 409


def test_partial_credit_never_rewards_over_ordering() -> None:
    """Over the rules themselves: any order other than the target's lines is 0, below the 0.5 floor."""
    task = shop.generate_task(3)
    exact = {"number": 1, "seeded": False, "lines": task["check"]["lines"], "shipping": task["check"]["shipping"]}
    more = {**exact, "lines": [{**line, "quantity": line["quantity"] + 1} for line in exact["lines"]]}
    seeded = {**exact, "seeded": True}
    assert shop.verify(task["check"], {"orders": [exact]})[0] == 1.0
    assert shop.verify(task["check"], {"orders": [seeded, exact]})[0] == 1.0
    assert shop.verify(task["check"], {"orders": [more]})[0] == 0.0
    assert shop.verify(task["check"], {"orders": [exact, exact]})[0] == 0.0
    assert shop.verify(task["check"], {"orders": [seeded]})[0] == 0.0


@pytest.mark.parametrize("state", [
    {}, {"orders": None}, {"orders": [{}]}, {"orders": [{"seeded": False}]},
    {"orders": [{"seeded": False, "number": 1, "lines": [{"product_id": "1", "options": {}, "quantity": 1}]}]},
    {"orders": [{"seeded": False, "number": 1, "lines": [{"product_id": 1, "options": [], "quantity": 1}]}]},
    {"orders": [{"seeded": False, "number": 1, "lines": "x"}]}, {"orders": "abc"}, [], None,
])
def test_verify_scores_a_malformed_state_zero_without_raising(state: Any) -> None:
    reward, reason = shop.verify(shop.generate_task(0)["check"], state)
    assert reward == 0.0 and reason


# -- hostile input ---------------------------------------------------------------------------------
@pytest.mark.parametrize("quantity", ["-1", "0", "1.5", "abc", "", " ", "1e3", "٣", "21", "0x10", "+1",
                                      "1 1", "99999999999999999999", "9" * 100_000, "2\x00"])
def test_bad_quantities_are_refused(server: ThreadingHTTPServer, quantity: str) -> None:
    client, task = open_task(server, 0)
    line = task["check"]["lines"][0]
    reply = client.post(f"/product/{line['product_id']}", [*line["options"].items(), ("quantity", quantity)])
    assert reply.status == 400 and 'role="alert"' in reply.text
    assert client.site.state()["cart"] == []
    add(client, line)
    line_id = next(iter(cart_lines(client).values()))[0]
    assert client.post(f"/cart/line/{line_id}/quantity", [("quantity", quantity)]).status == 400
    assert client.site.state()["cart"][0]["quantity"] == line["quantity"]


@pytest.mark.parametrize("options", [{}, {"colour": "chartreuse"}, {"colour": "<b>x</b>"}])
def test_missing_or_unknown_options_are_refused(server: ThreadingHTTPServer, options: dict[str, str]) -> None:
    client, task = open_task(server, 0)  # a mug: colour is its one option
    reply = client.post(f"/product/{task['check']['lines'][0]['product_id']}", [*options.items(), ("quantity", "1")])
    assert reply.status == 400 and "Choose a colour" in reply.text and "<b>x</b>" not in reply.text
    assert client.site.state()["cart"] == []


@pytest.mark.parametrize("path", ["/product/99999", "/product/0", "/product/-1", "/product/abc", "/product/%D9%A1%D9%A2%D9%A3",
                                  "/product/1.0", "/category/nope", "/order/1", "/order/-5", "/cart/line/9/x",
                                  "/../../etc/passwd", "/%2e%2e/%2e%2e/etc/passwd", "/product/../cart",
                                  "/static/../../../etc/passwd", "//etc/passwd", "/cart/..", "/nope", "/favicon.ico",
                                  "/" + "a" * 5000])
def test_unknown_paths_are_not_found(server: ThreadingHTTPServer, path: str) -> None:
    client, _ = open_task(server, 0)
    reply = client.get(path)
    assert reply.status in (404, 414) and "root:" not in reply.text and reply.headers["Content-Type"].startswith("text/html")


@pytest.mark.parametrize("method", ["PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"])
def test_other_methods_are_not_allowed(server: ThreadingHTTPServer, method: str) -> None:
    client, _ = open_task(server, 0)
    for path in ("/", "/cart", "/checkout"):
        reply = client.request(method, path)
        assert reply.status == 405 and "GET" in reply.headers["Allow"]
    assert client.get("/cart/line/1/remove").status == 405
    assert client.request("POST", "/", []).status == 405


def test_markup_in_every_field_is_escaped(server: ThreadingHTTPServer) -> None:
    client, task = open_task(server, 2)
    script = "<script>alert(1)</script>"
    shipping = {**task["check"]["shipping"], "full_name": script, "street": '"><img src=x onerror=alert(1)>',
                "city": "Zürich & <i>co</i>"}
    fill_cart(client, task["check"]["lines"])
    page = checkout(client, shipping).text
    assert "&lt;script&gt;" in page and "<script" not in page and "<img" not in page and "<i>" not in page
    assert client.site.state()["orders"][-1]["shipping"]["full_name"] == script
    reward, _ = shop.verify(task["check"], client.site.state())
    assert reward == 0.5
    found = client.get("/search?" + urlencode({"q": script})).text
    assert "<script" not in found and "&lt;script&gt;" in found


@pytest.mark.parametrize(("field", "value", "message"), [
    ("full_name", "", "Full name is required"), ("full_name", "x" * 150, "limit is 100"),
    ("full_name", "x" * 100_000, "limit is 200"), ("street", "1 Main\x07 Street", "control characters"),
    ("postcode", "<script>", "Postcode must be"), ("postcode", "1", "Postcode must be"),
    ("country", "Atlantis", "Choose a country"), ("method", "teleport", "Choose a shipping method"),
])
def test_bad_shipping_fields_are_refused(server: ThreadingHTTPServer, field: str, value: str, message: str) -> None:
    client, task = open_task(server, 2)
    fill_cart(client, task["check"]["lines"])
    reply = checkout(client, {**task["check"]["shipping"], field: value})
    assert reply.status == 400 and message in reply.text and "<script>" not in reply.text
    assert [o for o in client.site.state()["orders"] if not o["seeded"]] == []


def test_unicode_names_are_accepted(server: ThreadingHTTPServer) -> None:
    client, task = open_task(server, 2)
    fill_cart(client, task["check"]["lines"])
    reply = checkout(client, {**task["check"]["shipping"], "full_name": "José Müller-Łukasiewicz 山田"})
    assert reply.status == 200 and "José Müller-Łukasiewicz 山田" in reply.text


def test_bad_form_shapes_are_refused(server: ThreadingHTTPServer) -> None:
    client, task = open_task(server, 0)
    line = task["check"]["lines"][0]
    path = f"/product/{line['product_id']}"
    assert client.post(path, [("colour", line["options"]["colour"]), ("quantity", "1"), ("quantity", "2")]).status == 400
    assert client.post(path, [(f"f{i}", "x") for i in range(shop.MAX_FIELDS + 1)]).status == 400
    assert client.get("/search?" + urlencode({"q": "x" * 201})).status == 400
    assert client.get("/category/mugs?sort=evil").status == 400
    assert client.site.state()["cart"] == []
    site = client.site
    for query, form in [({"q": "x"}, {}), ({}, {"quantity": 1}), ({}, "quantity=1"), ({1: ["x"]}, {}),
                        ({"q": [None]}, {}), ({"q": ["1"] * 6}, {})]:
        status, _, body = site.handle("GET", "/search", query, form, {})  # type: ignore[arg-type]
        assert status == 400 and body
    odd_requests: list[tuple[Any, Any]] = [("FOO", "/"), ("", "/"), (None, "/"), ("GET", None), ("GET", b"/"),
                                           ("GET", ""), ("get", "/"), ("GET", "/\x00"), ("GET", "/product/1\n")]
    for method, path in odd_requests:
        status, _, body = site.handle(method, path, {}, {}, {})
        assert 400 <= status < 500 and body


def test_random_requests_never_raise_nor_fail_the_server() -> None:
    rng = random.Random(12)
    site = shop.Site(5)
    ids = [str(p.id) for p in site.catalogue] + ["0", "1", "99999", "-1", "x"]
    pieces = ["", "product", "cart", "line", "quantity", "remove", "checkout", "order", "orders", "search",
              "category", "mugs", "..", "%00", "\x00", "é", *ids]
    keys = ["quantity", "size", "colour", "paper", "volume", "token", "full_name", "street", "city",
            "postcode", "country", "method", "q", "sort", "line"]
    values = ["", "0", "1", "2", "-3", "M", "blue", "lined", "20 L", "express", "Germany", "<x>", "\x01",
              "9" * 250, "1", "3", "price_asc", "é" * 50]
    for _ in range(3000):
        path = "/" + "/".join(rng.choice(pieces) for _ in range(rng.randint(0, 4)))
        form = {rng.choice(keys): [rng.choice(values) for _ in range(rng.choice((1, 1, 1, 2)))]
                for _ in range(rng.randint(0, 6))}
        method = rng.choice(["GET", "POST", "POST", "PUT", "HEAD"])
        status, headers, body = site.handle(method, path, form if method == "GET" else {}, form, {})
        assert 200 <= status < 500 and headers["Content-Type"].startswith("text/html") and body
    state = site.state()
    json.dumps(state)
    shop.verify(shop.generate_task(0)["check"], state)


# -- determinism and variety -----------------------------------------------------------------------
def test_the_same_index_gives_the_same_task_and_site() -> None:
    for index in (0, 5, 11, 4999):
        task = shop.generate_task(index)
        assert json.dumps(task, sort_keys=True) == json.dumps(shop.generate_task(index), sort_keys=True)
        first, second = shop.Site(task["site_seed"]), shop.Site(task["site_seed"])
        assert first.state() == second.state()
        for path in ("/", "/cart", "/orders", f"/product/{first.catalogue[3].id}", "/category/hoodies"):
            assert first.handle("GET", path, {}, {}, {}) == second.handle("GET", path, {}, {}, {})


def test_tasks_and_sites_do_not_depend_on_the_process() -> None:
    """Hash randomization differs per process: the tasks and the pages must not."""
    script = ("import json, hashlib; from environments.browser.sandbox.sites import shop; s = shop.Site(7); "
              "pages = [s.handle('GET', p, {}, {}, {})[2] for p in ('/', '/cart', '/orders', '/category/socks')]; "
              "print(json.dumps([[shop.generate_task(i) for i in range(0, 600, 7)], s.state(), "
              "hashlib.sha256(b''.join(pages)).hexdigest()], sort_keys=True))")
    outputs = {subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=True,
                              env={**os.environ, "PYTHONHASHSEED": seed}).stdout for seed in ("1", "2", "random")}
    assert len(outputs) == 1 and len(next(iter(outputs))) > 1000


def test_at_least_five_thousand_distinct_tasks() -> None:
    tasks = [shop.generate_task(index) for index in range(5000)]
    assert len({task["goal"] for task in tasks}) == 5000
    assert len({task["site_seed"] for task in tasks}) == 5000
    families = [task["check"]["family"] for task in tasks]
    assert {families.count(family) for family in shop.FAMILIES} == {833, 834}


@pytest.mark.parametrize("index", [-1, 1.5, True, "3", None])
def test_a_bad_index_is_refused(index: Any) -> None:
    with pytest.raises(ValueError, match="expected a task index"):
        shop.generate_task(index)


@pytest.mark.parametrize("seed", [1.5, True, "3", None])
def test_a_bad_seed_is_refused(seed: Any) -> None:
    with pytest.raises(TypeError, match="expected an int seed"):
        shop.Site(seed)


def test_catalogue_invariants_hold_over_many_seeds() -> None:
    """Distinct prices make "cheapest" unique; a feature in exactly one description makes it a key."""
    phrases = [phrase for pool in shop.FEATURES.values() for phrase in pool]
    assert len(set(phrases)) == len(phrases)
    for phrase in phrases:
        assert [p for p in phrases if phrase.casefold() in p.casefold()] == [phrase]
        assert not any(phrase.casefold() in text.casefold() for text in (*shop.BLURBS, *shop.ADJECTIVES))
    for seed in range(200):
        catalogue = shop.build_catalogue(seed)
        assert len({p.price_cents for p in catalogue}) == len(catalogue)
        assert len({p.id for p in catalogue}) == len({p.name for p in catalogue}) == len(catalogue)
        for product in catalogue:
            holders = [p for p in catalogue if product.feature.casefold() in f"{p.name} {p.description}".casefold()]
            assert holders == [product]
            assert all(values for _, _, values in product.options)


def test_odd_seeds_start_with_a_cart_and_every_shop_with_a_history() -> None:
    for seed in range(40):
        state = shop.Site(seed).state()
        assert len(state["cart"]) == (3 if seed % 2 else 0)
        assert 2 <= len(state["orders"]) <= 3 and all(order["seeded"] for order in state["orders"])


# -- the real browser -------------------------------------------------------------------------------
@pytest.mark.skipif(shutil.which("chromium") is None and not Path("/usr/bin/chromium").exists(),
                    reason="needs Chromium at /usr/bin/chromium")
def test_chromium_parses_a_product_page(server: ThreadingHTTPServer, tmp_path: Path) -> None:
    client, _ = open_task(server, 2)
    product = next(p for p in client.site.catalogue if p.category.slug == "t-shirts")
    result = subprocess.run(
        ["/usr/bin/chromium", "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path}",
         "--dump-dom", f"http://127.0.0.1:{client.port}/product/{product.id}"],
        capture_output=True, text=True, timeout=120, check=True)
    dom = result.stdout
    assert f"<h1>{html.escape(product.name)}</h1>" in dom and html.escape(product.description) in dom
    sizes = "".join(f"<option>{size}</option>" for size in product.options[0][2])
    assert f'<select id="option-size" name="size"><option value="">Choose a size</option>{sizes}</select>' in dom
    assert dom.count('type="radio" id="option-colour-') == len(product.options[1][2])
    assert '<label for="quantity">Quantity</label>' in dom and '<button type="submit">Add to cart</button>' in dom
