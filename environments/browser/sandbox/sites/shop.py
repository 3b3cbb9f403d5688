"""A self-hosted shop for browser tasks: catalogue, search, cart, checkout and order history, in memory.

Imported twice: inside the browser sandbox, where the driver serves `Site(seed).handle` on 127.0.0.1, and
on the host, where `generate_task` makes tasks and `verify` scores an episode from `Site.state()` (what
was ordered), never from anything the agent says. Pure stdlib and deterministic: `Site(seed)` always
builds the same catalogue and start state, `generate_task(i)` always the same task.

    python3 -c "from environments.browser.sandbox.sites import shop; print(shop.generate_task(5)['goal'])"

Start state: every shop has two or three earlier orders in its history; an odd seed also starts with
three lines in the cart (the `cart_edit` family uses those seeds, every other family an even seed).

Verify rules (the agent optimizes the reward, so every extra is a loss, never a win):
- orders that were in the seeded history do not count; the orders placed during the episode do;
- no order placed -> 0; more than one order placed -> 0 (a second order is never free);
- the one order's lines must equal the target exactly: same products, same options, same quantities,
  nothing missing, nothing extra -> otherwise 0 (so over-ordering scores 0, below any exact answer);
- right lines but any shipping field wrong (name, street, city, postcode, country, method) -> 0.5;
  text fields compare after trimming, collapsing whitespace and ignoring case;
- everything right -> 1.0. An order is a snapshot: editing the cart after checkout changes nothing.
"""

from __future__ import annotations

import html
import random
import re
import threading
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Response = tuple[int, dict[str, str], bytes]

MAX_VALUE_CHARS = 200  # any single form or query value; a name or a street is far shorter
MAX_FIELDS = 40  # distinct keys in one form or query
MAX_PATH_CHARS = 2048
MAX_QUANTITY = 20  # per cart line
MAX_CART_LINES = 30

SIZES = ("XS", "S", "M", "L", "XL")
SHOE_SIZES = ("38", "39", "40", "41", "42", "43", "44", "45", "46")
SOCK_SIZES = ("S", "M", "L")
COLOURS = ("black", "white", "grey", "navy", "blue", "red", "green", "yellow", "orange", "purple")
PAPERS = ("lined", "dotted", "blank", "squared")
VOLUMES = ("20 L", "25 L", "30 L", "35 L")
COUNTRIES = ("Austria", "Belgium", "Denmark", "France", "Germany", "Ireland", "Italy", "Netherlands",
             "Portugal", "Spain", "Sweden", "United Kingdom")
# (value, label, price in cents); the value is what the radio button submits and what verify compares
SHIPPING_METHODS = (("standard", "Standard (3-5 business days)", 495),
                    ("express", "Express (1-2 business days)", 1495),
                    ("economy", "Economy (6-10 business days)", 0))
SHIPPING_FIELDS = ("full_name", "street", "city", "postcode", "country", "method")


@dataclass(frozen=True)
class OptionSpec:
    name: str
    widget: str  # "select" or "radio"
    pool: tuple[str, ...]
    least: int  # a product offers at least this many of the pool's values
    contiguous: bool  # sizes come as a run (S..L); colours as any subset


@dataclass(frozen=True)
class Category:
    slug: str
    title: str
    singular: str  # "T-shirt": used in goals ("the cheapest T-shirt")
    noun: str  # the last word of every product name in the category
    price_cents: tuple[int, int]
    options: tuple[OptionSpec, ...]


_SIZE = OptionSpec("size", "select", SIZES, 3, True)
_COLOUR = OptionSpec("colour", "radio", COLOURS, 2, False)
CATEGORIES = (
    Category("t-shirts", "T-shirts", "T-shirt", "T-shirt", (1200, 3500), (_SIZE, _COLOUR)),
    Category("hoodies", "Hoodies", "hoodie", "Hoodie", (3500, 7500), (_SIZE, _COLOUR)),
    Category("sneakers", "Sneakers", "pair of sneakers", "Sneakers", (5500, 14000),
             (OptionSpec("size", "select", SHOE_SIZES, 4, True), _COLOUR)),
    Category("caps", "Caps", "cap", "Cap", (1500, 3500), (_COLOUR,)),
    Category("mugs", "Mugs", "mug", "Mug", (800, 2400), (_COLOUR,)),
    Category("backpacks", "Backpacks", "backpack", "Backpack", (3000, 12000),
             (OptionSpec("volume", "select", VOLUMES, 2, True), _COLOUR)),
    Category("notebooks", "Notebooks", "notebook", "Notebook", (500, 2200),
             (OptionSpec("paper", "radio", PAPERS, 2, False),)),
    Category("socks", "Socks", "pair of socks", "Socks", (600, 1800),
             (OptionSpec("size", "select", SOCK_SIZES, 2, True), _COLOUR)),
)
ADJECTIVES = ("Harbor", "Summit", "Meadow", "Ember", "Drift", "Granite", "Willow", "Aspen", "Falcon",
              "Juniper", "Lantern", "Maple", "Nimbus", "Orchard", "Pioneer", "Quarry", "Ridge", "Tundra",
              "Valley", "Alder", "Beacon", "Canyon", "Delta", "Echo", "Fjord", "Glacier", "Hollow",
              "Jetty", "Kestrel", "Lagoon", "Mesa", "Oasis", "Prairie", "Quill", "Rover", "Sierra",
              "Trail", "Vista", "Wren", "Zephyr")
# Per category, one per product, never repeated within a shop, so "the product whose description mentions
# X" is unique. No phrase is part of another or of the description's fixed text (the tests check it).
FEATURES = {
    "t-shirts": ("organic Peruvian cotton", "tagless neck", "raglan sleeves", "boxy fit", "split hem",
                 "heat-reactive print", "artist collaboration print", "pre-shrunk fabric", "plant-based dye"),
    "hoodies": ("brushed fleece interior", "thumbhole cuffs", "kangaroo pouch", "contrast drawcords",
                "zip-off hood", "hidden phone pocket", "cashmere blend", "stone-washed finish",
                "embroidered compass"),
    "sneakers": ("cork insole", "cushioned arch support", "vegan leather trim", "gum rubber sole",
                 "ankle padding", "reflective piping", "breathable mesh upper", "recycled fishing nets",
                 "glow-in-the-dark laces"),
    "caps": ("adjustable leather strap", "curved brim", "flat brim", "moisture-wicking sweatband",
             "copper eyelets", "waxed canvas panels", "hand-numbered label", "heritage wash",
             "laser-etched pattern"),
    "mugs": ("hand-painted glaze", "speckled enamel", "dishwasher-safe stoneware", "oversized handle",
             "insulated double wall", "snap-on lid", "ceramic glaze drips", "gold rim", "hidden message inside"),
    "backpacks": ("padded laptop sleeve", "water bottle holder", "chest strap", "lockable zips", "rain cover",
                  "trekking pole loops", "magnetic closure", "expandable inner pocket", "hidden key pocket"),
    "notebooks": ("lay-flat binding", "gold foil edges", "elastic bookmark band", "numbered pages",
                  "acid-free paper", "perforated sheets", "fold-out map print", "fountain pen friendly ink test",
                  "lifetime refill offer"),
    "socks": ("merino wool blend", "seamless toe", "reinforced heel", "arch compression zone", "double-stitched hems",
              "bamboo fibre yarn", "fair trade certificate", "charity donation", "limited edition run"),
}
BLURBS = ("Built to last through daily use.", "A customer favourite for years.",
          "Designed in our own studio.", "Shipped in plastic-free packaging.", "Easy to care for.")
FIRST_NAMES = ("Ana", "Ben", "Chloe", "Dario", "Elif", "Farah", "Gustav", "Hana", "Ivan", "Jonas",
               "Kaia", "Luca", "Maren", "Nils", "Olga", "Pedro", "Quinn", "Rosa", "Sami", "Tess",
               "Ugo", "Vera", "Wim", "Ximena", "Yara", "Zoltan")
LAST_NAMES = ("Andersen", "Bauer", "Costa", "Dubois", "Eriksson", "Fischer", "Garcia", "Hansen",
              "Ivanova", "Jansen", "Kowalski", "Lambert", "Moreau", "Novak", "O'Brien", "Peeters",
              "Quist", "Rossi", "Silva", "Torres", "Ulrich", "Visser", "Weber", "Young", "Zeller")
STREETS = ("Linden Street", "Harbour Road", "Mill Lane", "Station Avenue", "Church Street",
           "Elm Grove", "Canal Walk", "Market Square", "Orchard Way", "Bridge Street", "Park Terrace",
           "Chestnut Road", "Rose Lane", "Quay Street", "Hill Crescent", "Meadow Drive")
CITIES = ("Porto", "Lyon", "Ghent", "Aarhus", "Graz", "Cork", "Bologna", "Utrecht", "Malmo", "Leeds",
          "Seville", "Bremen", "Nantes", "Odense", "Linz", "Galway", "Verona", "Leiden", "Uppsala",
          "Bristol", "Valencia", "Dresden")


@dataclass(frozen=True)
class Product:
    id: int
    name: str
    category: Category
    price_cents: int
    description: str
    feature: str
    options: tuple[tuple[str, str, tuple[str, ...]], ...]  # (name, widget, values offered)


def build_catalogue(seed: int) -> tuple[Product, ...]:
    """Eight categories of five to eight products; every price and every feature distinct in a shop."""
    rng = random.Random(f"shop/{seed}/catalogue")
    ids = rng.sample(range(100, 1000), k=len(CATEGORIES) * 8)  # ids that say nothing about price
    prices: set[int] = set()
    products = []
    for category in CATEGORIES:
        features = rng.sample(FEATURES[category.slug], k=rng.randint(5, 8))
        for adjective, feature in zip(rng.sample(ADJECTIVES, k=len(features)), features, strict=True):
            price = _distinct_price(rng, category.price_cents, prices)
            options = tuple((spec.name, spec.widget, _draw_values(rng, spec)) for spec in category.options)
            name = f"{adjective} {category.noun}"
            description = (f"The {name} belongs to our {category.title.lower()} range. "
                           f"{rng.choice(BLURBS)} Special detail: {feature}.")
            products.append(Product(ids.pop(), name, category, price, description, feature, options))
    return tuple(products)


def _distinct_price(rng: random.Random, bounds: tuple[int, int], taken: set[int]) -> int:
    while True:
        price = rng.randrange(bounds[0] // 100, bounds[1] // 100) * 100 + rng.choice((0, 49, 50, 95, 99))
        if price not in taken:
            taken.add(price)
            return price


def _draw_values(rng: random.Random, spec: OptionSpec) -> tuple[str, ...]:
    count = rng.randint(spec.least, min(len(spec.pool), spec.least + 2))
    if spec.contiguous:
        start = rng.randint(0, len(spec.pool) - count)
        return spec.pool[start:start + count]
    chosen = set(rng.sample(spec.pool, k=count))
    return tuple(value for value in spec.pool if value in chosen)


def draw_address(rng: random.Random) -> dict[str, str]:
    return {"full_name": f"{rng.choice(FIRST_NAMES)} {rng.choice(LAST_NAMES)}",
            "street": f"{rng.randint(1, 199)} {rng.choice(STREETS)}", "city": rng.choice(CITIES),
            "postcode": str(rng.randint(10000, 99999)), "country": rng.choice(COUNTRIES)}


def draw_lines(rng: random.Random, products: list[Product], count: int, most: int) -> list[dict[str, Any]]:
    """`count` lines of distinct products, each with a valid value for every option, quantity 1..most."""
    return [{"product_id": p.id, "name": p.name, "quantity": rng.randint(1, most),
             "options": {name: rng.choice(values) for name, _, values in p.options}}
            for p in rng.sample(products, k=count)]


def format_price(cents: int) -> str:
    return f"${cents // 100}.{cents % 100:02d}"


def describe_options(options: dict[str, str]) -> str:
    return ", ".join(f"{name} {value}" for name, value in options.items())


class Refused(Exception):
    """Bad input from the browser: answered with a 4xx page, never raised out of `Site.handle`."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}


def _start_state(seed: int, catalogue: tuple[Product, ...]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The seeded order history (two or three orders) and, for an odd seed, three lines in the cart."""
    rng = random.Random(f"shop/{seed}/start")
    by_id = {product.id: product for product in catalogue}
    account = draw_address(rng)
    number, orders = rng.randint(10001, 98999), []
    for month in sorted(rng.sample(range(1, 13), k=rng.randint(2, 3))):
        number += rng.randint(1, 40)
        shipping = {**account, "method": rng.choice(SHIPPING_METHODS)[0]}
        lines = draw_lines(rng, list(catalogue), rng.randint(1, 3), 3)
        orders.append(_order_record(number, f"2024-{month:02d}-{rng.randint(1, 28):02d}", lines, shipping, by_id))
    cart = []
    if seed % 2:
        for line_id, line in enumerate(draw_lines(rng, list(catalogue), 3, 3), start=1):
            cart.append({"line": line_id, "product_id": line["product_id"], "options": line["options"],
                         "quantity": line["quantity"]})
    return cart, orders


def _order_record(number: int, date: str | None, lines: list[dict[str, Any]], shipping: dict[str, str],
                  by_id: dict[int, Product]) -> dict[str, Any]:
    items = [{"product_id": line["product_id"], "name": by_id[line["product_id"]].name,
              "options": dict(line["options"]), "quantity": line["quantity"],
              "unit_price_cents": by_id[line["product_id"]].price_cents} for line in lines]
    subtotal = sum(item["unit_price_cents"] * item["quantity"] for item in items)
    shipping_cents = next(cents for value, _, cents in SHIPPING_METHODS if value == shipping["method"])
    return {"number": number, "date": date, "seeded": date is not None, "lines": items,
            "shipping": dict(shipping), "subtotal_cents": subtotal, "shipping_cents": shipping_cents,
            "total_cents": subtotal + shipping_cents}


_QUANTITY = re.compile(r"[0-9]{1,4}", re.ASCII)
_POSTCODE = re.compile(r"[A-Za-z0-9][A-Za-z0-9 -]{1,9}", re.ASCII)
_SORTS = {"featured": "Featured", "price_asc": "Price: low to high", "price_desc": "Price: high to low",
          "name": "Name"}
_STYLE = ("body{font-family:sans-serif;max-width:60em;margin:1em auto;padding:0 1em}nav a{margin-right:1em}"
          "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.3em .6em;text-align:left}"
          "[role=alert]{color:#a00;border:1px solid #a00;padding:.5em}fieldset{margin:.8em 0}")


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _field(fields: dict[str, list[str]], key: str) -> str | None:
    """The one value of `key`, or None when absent; two values for one field are refused."""
    values = fields.get(key)
    if not values:
        return None
    if len(values) != 1:
        raise Refused(400, f"Expected one value for the field {key!r}, got {len(values)}.")
    return values[0]


def _check_fields(kind: str, fields: object) -> dict[str, list[str]]:
    if fields is None:
        return {}
    if not isinstance(fields, dict):
        raise Refused(400, f"Expected the {kind} as a mapping of names to lists of values.")
    if len(fields) > MAX_FIELDS:
        raise Refused(400, f"The {kind} has {len(fields)} fields; the limit is {MAX_FIELDS}.")
    for key, values in fields.items():
        if not isinstance(key, str) or len(key) > 64:
            raise Refused(400, f"A {kind} field name is not text of at most 64 characters.")
        if not isinstance(values, list) or len(values) > 5 or not all(isinstance(v, str) for v in values):
            raise Refused(400, f"The {kind} field {key[:64]!r} is not a list of at most 5 text values.")
        for value in values:
            if len(value) > MAX_VALUE_CHARS:
                raise Refused(400, f"The {kind} field {key!r} is {len(value)} characters long; "
                                   f"the limit is {MAX_VALUE_CHARS}.")
    return fields


def parse_quantity(raw: str | None) -> int:
    text = (raw or "").strip()
    if not _QUANTITY.fullmatch(text) or not 1 <= int(text) <= MAX_QUANTITY:
        raise ValueError(f"Quantity must be a whole number from 1 to {MAX_QUANTITY}, not {text[:20]!r}.")
    return int(text)


def _clean_text(raw: str | None, label: str, errors: list[str]) -> str:
    text = " ".join((raw or "").split())
    if not text:
        errors.append(f"{label} is required.")
    elif len(text) > 100:
        errors.append(f"{label} is {len(text)} characters long; the limit is 100.")
    elif any(unicodedata.category(char) in ("Cc", "Cs") for char in text):
        errors.append(f"{label} contains control characters.")
    return text


class Site:
    """One shop's catalogue and state, served page by page; a fresh `Site(seed)` is a fresh episode."""

    name = "shop"

    def __init__(self, seed: int) -> None:
        if type(seed) is not int:
            raise TypeError(f"expected an int seed, got {seed!r}")
        self.seed = seed
        self.catalogue = build_catalogue(seed)
        self._by_id = {product.id: product for product in self.catalogue}
        self._cart, self._orders = _start_state(seed, self.catalogue)
        self._next_line = len(self._cart) + 1
        self._next_order = self._orders[-1]["number"] + 1
        self._cart_revision = 0  # the checkout token: a form from an older cart is refused
        self._placed: dict[str, int] = {}  # checkout token -> the order it placed (resubmission is idempotent)
        self._lock = threading.Lock()
        self._routes: list[tuple[re.Pattern[str], dict[str, Callable[..., Response]]]] = [
            (re.compile(pattern, re.ASCII), handlers) for pattern, handlers in (
                (r"/", {"GET": self._home}),
                (r"/category/([a-z-]{1,30})", {"GET": self._category}),
                (r"/search", {"GET": self._search}),
                (r"/product/([0-9]{1,6})", {"GET": self._product, "POST": self._add_to_cart}),
                (r"/cart", {"GET": self._cart_page}),
                (r"/cart/line/([0-9]{1,6})/quantity", {"POST": self._set_quantity}),
                (r"/cart/line/([0-9]{1,6})/remove", {"POST": self._remove_line}),
                (r"/checkout", {"GET": self._checkout, "POST": self._place_order}),
                (r"/orders", {"GET": self._history}),
                (r"/order/([0-9]{1,9})", {"GET": self._order_page}),
            )]

    def handle(self, method: str, path: str, query: dict[str, list[str]], form: dict[str, list[str]],
               cookies: dict[str, str]) -> Response:
        with self._lock:
            try:
                return self._dispatch(method, path, query, form)
            except Refused as refused:
                body = (f'<p role="alert">{_e(refused.message)}</p><p><a href="/">Back to the shop</a> '
                        '<a href="/cart">Your cart</a></p>')
                return self._page(refused.status, _REASONS.get(refused.status, "Error"), body,
                                  headers=refused.headers)
            except Exception as error:  # a bug, not bad input: still a page, so the driver keeps serving
                return self._page(500, "Server error", f"<p>{_e(type(error).__name__)}</p>")

    def state(self) -> dict[str, Any]:
        """Ground truth for verify: every order (seeded history and placed) and the current cart."""
        with self._lock:
            cart = [{**line, "options": dict(line["options"]), "name": self._by_id[line["product_id"]].name,
                     "unit_price_cents": self._by_id[line["product_id"]].price_cents} for line in self._cart]
            orders = [{**order, "lines": [{**line, "options": dict(line["options"])} for line in order["lines"]],
                       "shipping": dict(order["shipping"])} for order in self._orders]
            return {"site": self.name, "seed": self.seed, "cart": cart, "orders": orders}

    def _dispatch(self, method: object, path: object, query: object, form: object) -> Response:
        if not isinstance(method, str) or not isinstance(path, str) or not path.startswith("/"):
            raise Refused(400, "Expected the method as text and the path as text that starts with '/'.")
        if len(path) > MAX_PATH_CHARS:
            raise Refused(414, f"The path is {len(path)} characters long; the limit is {MAX_PATH_CHARS}.")
        fields = {"query": _check_fields("query", query), "form": _check_fields("form", form)}
        route = path.rstrip("/") or "/"
        for pattern, handlers in self._routes:
            match = pattern.fullmatch(route)
            if match is None:
                continue
            handler = handlers.get(method)
            if handler is None:
                raise Refused(405, f"The method {method[:20]!r} is not allowed here; expected "
                                   f"{' or '.join(handlers)}.", {"Allow": ", ".join(handlers)})
            return handler(*match.groups(), **fields)
        raise Refused(404, f"There is no page at {path[:200]!r}.")

    # -- pages ------------------------------------------------------------------------------------
    def _home(self, *, query: dict[str, list[str]], form: dict[str, list[str]]) -> Response:
        items = "".join(f'<li><a href="/category/{c.slug}">{_e(c.title)}</a> '
                        f"({sum(p.category is c for p in self.catalogue)} products)</li>" for c in CATEGORIES)
        body = (f'<section aria-labelledby="categories"><h2 id="categories">Categories</h2><ul>{items}</ul>'
                f'</section><section aria-labelledby="find"><h2 id="find">Search</h2>{_search_form("")}'
                "</section>")
        return self._page(200, "Welcome to the shop", body)

    def _category(self, slug: str, *, query: dict[str, list[str]], form: dict[str, list[str]]) -> Response:
        category = next((c for c in CATEGORIES if c.slug == slug), None)
        if category is None:
            raise Refused(404, f"There is no category {slug!r}.")
        sort = _field(query, "sort") or "featured"
        if sort not in _SORTS:
            raise Refused(400, f"Expected sort to be one of {', '.join(_SORTS)}, not {sort[:40]!r}.")
        products = [p for p in self.catalogue if p.category is category]
        if sort != "featured":
            key: Callable[[Product], Any] = (lambda p: p.name) if sort == "name" else (lambda p: p.price_cents)
            products.sort(key=key, reverse=sort == "price_desc")
        choices = "".join(f'<option value="{value}"{" selected" if value == sort else ""}>{label}</option>'
                          for value, label in _SORTS.items())
        body = (f'<form method="get" action="/category/{slug}"><label for="sort">Sort by</label> '
                f'<select id="sort" name="sort">{choices}</select> <button type="submit">Sort</button></form>'
                f"{_product_list(products)}")
        return self._page(200, category.title, body)

    def _search(self, *, query: dict[str, list[str]], form: dict[str, list[str]]) -> Response:
        words = " ".join((_field(query, "q") or "").split())
        if not words:
            return self._page(200, "Search", _search_form(""))
        found = [p for p in self.catalogue if words.casefold() in f"{p.name} {p.description}".casefold()]
        result = _product_list(found) if found else "<p>No products match.</p>"
        body = f'{_search_form(words)}<h2>{len(found)} results for "{_e(words)}"</h2>{result}'
        return self._page(200, "Search", body)

    def _product(self, product_id: str, *, query: dict[str, list[str]], form: dict[str, list[str]],
                 status: int = 200, errors: tuple[str, ...] = ()) -> Response:
        product = self._find_product(product_id)
        controls = "".join(_option_control(name, widget, values, _field(form, name))
                           for name, widget, values in product.options)
        quantity = _field(form, "quantity") or "1"
        body = (f"<p>Price: <strong>{format_price(product.price_cents)}</strong></p><p>Category: "
                f'<a href="/category/{product.category.slug}">{_e(product.category.title)}</a></p>'
                f'<p>{_e(product.description)}</p><form method="post" action="/product/{product.id}">'
                f'{controls}<p><label for="quantity">Quantity</label> <input id="quantity" name="quantity" '
                f'type="number" min="1" max="{MAX_QUANTITY}" value="{_e(quantity)}"></p>'
                '<button type="submit">Add to cart</button></form>')
        return self._page(status, product.name, body, errors=errors)

    def _add_to_cart(self, product_id: str, *, query: dict[str, list[str]],
                     form: dict[str, list[str]]) -> Response:
        product = self._find_product(product_id)
        errors, options = [], {}
        for name, _, values in product.options:
            chosen = _field(form, name)
            if chosen not in values:
                errors.append(f"Choose a {name}: one of {', '.join(values)}"
                              + (f" (not {chosen[:40]!r})." if chosen else "."))
            options[name] = chosen
        try:
            quantity = parse_quantity(_field(form, "quantity"))
        except ValueError as error:
            errors.append(str(error))
        if not errors:
            line = next((line for line in self._cart
                         if line["product_id"] == product.id and line["options"] == options), None)
            if line is not None and line["quantity"] + quantity > MAX_QUANTITY:
                errors.append(f"The cart already holds {line['quantity']} of this; at most {MAX_QUANTITY}.")
            elif line is None and len(self._cart) >= MAX_CART_LINES:
                errors.append(f"The cart already holds {MAX_CART_LINES} lines, the most it can.")
        if errors:
            return self._product(product_id, query=query, form=form, status=400, errors=tuple(errors))
        if line is None:
            self._cart.append({"line": self._next_line, "product_id": product.id, "options": options,
                               "quantity": quantity})
            self._next_line += 1
        else:
            line["quantity"] += quantity
        self._cart_revision += 1
        return _redirect("/cart")

    def _cart_page(self, *, query: dict[str, list[str]], form: dict[str, list[str]], status: int = 200,
                   errors: tuple[str, ...] = ()) -> Response:
        if not self._cart:
            return self._page(status, "Your cart", '<p>Your cart is empty.</p><p><a href="/">Continue '
                                                   "shopping</a></p>", errors=errors)
        body = (f"{self._lines_table(self._cart, editable=True)}<p>Subtotal: "
                f"<strong>{format_price(self._subtotal())}</strong></p>"
                '<p><a href="/checkout">Proceed to checkout</a> <a href="/">Continue shopping</a></p>')
        return self._page(status, "Your cart", body, errors=errors)

    def _set_quantity(self, line_id: str, *, query: dict[str, list[str]],
                      form: dict[str, list[str]]) -> Response:
        line = self._find_line(line_id)
        try:
            line["quantity"] = parse_quantity(_field(form, "quantity"))
        except ValueError as error:
            return self._cart_page(query=query, form=form, status=400,
                                   errors=(f"{error} Use Remove to take a line out of the cart.",))
        self._cart_revision += 1
        return _redirect("/cart")

    def _remove_line(self, line_id: str, *, query: dict[str, list[str]],
                     form: dict[str, list[str]]) -> Response:
        self._cart.remove(self._find_line(line_id))
        self._cart_revision += 1
        return _redirect("/cart")

    def _checkout(self, *, query: dict[str, list[str]], form: dict[str, list[str]], status: int = 200,
                  errors: tuple[str, ...] = ()) -> Response:
        if not self._cart:
            return self._page(status, "Checkout", '<p>Your cart is empty, so there is nothing to check out.'
                                                  '</p><p><a href="/">Continue shopping</a></p>', errors=errors)
        fields = "".join(_text_input(key, label, _field(form, key)) for key, label in
                         (("full_name", "Full name"), ("street", "Street and number"), ("city", "City"),
                          ("postcode", "Postcode")))
        country = _field(form, "country")
        countries = "".join(f'<option{" selected" if c == country else ""}>{_e(c)}</option>' for c in COUNTRIES)
        method = _field(form, "method")
        methods = "".join(
            f'<p><input type="radio" id="method-{value}" name="method" value="{value}"'
            f'{" checked" if value == method else ""}> <label for="method-{value}">{_e(label)}: '
            f"{format_price(cents) if cents else 'free'}</label></p>" for value, label, cents in SHIPPING_METHODS)
        body = (f"<h2>Order summary</h2>{self._lines_table(self._cart, editable=False)}<p>Subtotal: "
                f'{format_price(self._subtotal())} (shipping is added)</p><form method="post" action="/checkout">'
                f'<input type="hidden" name="token" value="{self._cart_revision}"><fieldset><legend>Shipping '
                f'address</legend>{fields}<p><label for="country">Country</label> <select id="country" '
                f'name="country"><option value="">Choose a country</option>{countries}</select></p></fieldset>'
                f"<fieldset><legend>Shipping method</legend>{methods}</fieldset>"
                '<button type="submit">Place order</button></form>')
        return self._page(status, "Checkout", body, errors=errors)

    def _place_order(self, *, query: dict[str, list[str]], form: dict[str, list[str]]) -> Response:
        token = _field(form, "token") or ""
        if token in self._placed:  # the same form submitted again: the order it placed, not a second one
            return _redirect(f"/order/{self._placed[token]}")
        if token != str(self._cart_revision):
            raise Refused(409, "The cart changed after this checkout page was opened. Open the checkout "
                               "page again, check the order and submit it from there.")
        if not self._cart:
            raise Refused(400, "The cart is empty, so there is nothing to check out.")
        errors: list[str] = []
        shipping = {key: _clean_text(_field(form, key), label, errors) for key, label in
                    (("full_name", "Full name"), ("street", "Street and number"), ("city", "City"))}
        shipping["postcode"] = (_field(form, "postcode") or "").strip()
        if not _POSTCODE.fullmatch(shipping["postcode"]):
            errors.append("Postcode must be 2 to 10 letters, digits, spaces or hyphens.")
        shipping["country"] = _field(form, "country") or ""
        if shipping["country"] not in COUNTRIES:
            errors.append("Choose a country from the list.")
        shipping["method"] = _field(form, "method") or ""
        if shipping["method"] not in (value for value, _, _ in SHIPPING_METHODS):
            errors.append(f"Choose a shipping method: {', '.join(v for v, _, _ in SHIPPING_METHODS)}.")
        if errors:
            return self._checkout(query=query, form=form, status=400, errors=tuple(errors))
        number = self._next_order
        self._orders.append(_order_record(number, None, self._cart, shipping, self._by_id))
        self._next_order += 1
        self._placed[token] = number
        self._cart = []
        self._cart_revision += 1
        return _redirect(f"/order/{number}")

    def _order_page(self, number: str, *, query: dict[str, list[str]], form: dict[str, list[str]]) -> Response:
        order = next((o for o in self._orders if o["number"] == int(number)), None)
        if order is None:
            raise Refused(404, f"There is no order #{number}.")
        ship = order["shipping"]
        method = next(label for value, label, _ in SHIPPING_METHODS if value == ship["method"])
        thanks = "" if order["seeded"] else "<p>Thank you! Your order has been placed.</p>"
        body = (f"{thanks}<p>Placed: {_e(order['date'] or 'today')}</p>"
                f"{self._lines_table(order['lines'], editable=False)}<h2>Shipping</h2><address>"
                f"{_e(ship['full_name'])}<br>{_e(ship['street'])}<br>{_e(ship['city'])}, {_e(ship['postcode'])}"
                f"<br>{_e(ship['country'])}</address><p>Method: {_e(method)}</p><p>Items: "
                f"{format_price(order['subtotal_cents'])}; shipping: {format_price(order['shipping_cents'])}; "
                f"total: <strong>{format_price(order['total_cents'])}</strong></p>"
                '<p><a href="/orders">All orders</a></p>')
        return self._page(200, f"Order #{order['number']}", body)

    def _history(self, *, query: dict[str, list[str]], form: dict[str, list[str]]) -> Response:
        rows = "".join(f'<tr><td><a href="/order/{o["number"]}">Order #{o["number"]}</a></td>'
                       f"<td>{_e(o['date'] or 'today')}</td><td>{sum(i['quantity'] for i in o['lines'])}</td>"
                       f"<td>{format_price(o['total_cents'])}</td></tr>" for o in reversed(self._orders))
        body = ("<table><caption>Your orders, newest first</caption><thead><tr><th>Order</th><th>Date</th>"
                f"<th>Items</th><th>Total</th></tr></thead><tbody>{rows}</tbody></table>")
        return self._page(200, "Order history", body)

    # -- pieces -----------------------------------------------------------------------------------
    def _find_product(self, product_id: str) -> Product:
        product = self._by_id.get(int(product_id))
        if product is None:
            raise Refused(404, f"There is no product {product_id}.")
        return product

    def _find_line(self, line_id: str) -> dict[str, Any]:
        line = next((line for line in self._cart if line["line"] == int(line_id)), None)
        if line is None:
            raise Refused(404, f"There is no line {line_id} in the cart.")
        return line

    def _subtotal(self) -> int:
        return sum(self._by_id[line["product_id"]].price_cents * line["quantity"] for line in self._cart)

    def _lines_table(self, lines: list[dict[str, Any]], *, editable: bool) -> str:
        rows = []
        for line in lines:
            product = self._by_id[line["product_id"]]
            what = f"{product.name} ({describe_options(line['options'])})"
            quantity = str(line["quantity"])
            if editable:
                quantity = (f'<form method="post" action="/cart/line/{line["line"]}/quantity"><input '
                            f'name="quantity" type="number" min="1" max="{MAX_QUANTITY}" value="{quantity}" '
                            f'aria-label="Quantity of {_e(what)}"> <button type="submit" aria-label="Update '
                            f'quantity of {_e(what)}">Update</button></form>')
            remove = (f'<td><form method="post" action="/cart/line/{line["line"]}/remove"><button '
                      f'type="submit" aria-label="Remove {_e(what)}">Remove</button></form></td>'
                      if editable else "")
            rows.append(f'<tr><td><a href="/product/{product.id}">{_e(product.name)}</a></td>'
                        f"<td>{_e(describe_options(line['options']))}</td><td>{format_price(product.price_cents)}"
                        f"</td><td>{quantity}</td><td>{format_price(product.price_cents * line['quantity'])}</td>"
                        f"{remove}</tr>")
        remove_head = "<th>Remove</th>" if editable else ""
        return ("<table><thead><tr><th>Product</th><th>Options</th><th>Price</th><th>Quantity</th>"
                f"<th>Line total</th>{remove_head}</tr></thead><tbody>{''.join(rows)}</tbody></table>")

    def _page(self, status: int, title: str, body: str, *, errors: tuple[str, ...] = (),
              headers: dict[str, str] | None = None) -> Response:
        count = sum(line["quantity"] for line in self._cart)
        alert = ""
        if errors:
            alert = ('<div role="alert"><p>Please fix:</p><ul>'
                     + "".join(f"<li>{_e(error)}</li>" for error in errors) + "</ul></div>")
        document = (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{_e(title)} - Shop'
                    f"</title><style>{_STYLE}</style></head><body><header><nav aria-label=\"Main\">"
                    '<a href="/">Home</a><a href="/search">Search</a>'
                    f'<a href="/cart">Cart ({count} items)</a><a href="/orders">Order history</a></nav></header>'
                    f"<main><h1>{_e(title)}</h1>{alert}{body}</main></body></html>")
        return status, {**_HEADERS, **(headers or {})}, document.encode()


_HEADERS = {"Content-Type": "text/html; charset=utf-8", "Cache-Control": "no-store",
            "X-Content-Type-Options": "nosniff"}
_REASONS = {400: "Bad request", 404: "Not found", 405: "Method not allowed", 409: "Conflict",
            414: "Path too long"}


def _redirect(location: str) -> Response:
    body = f'<!DOCTYPE html><html lang="en"><title>Moved</title><a href="{_e(location)}">Continue</a></html>'
    return 303, {**_HEADERS, "Location": location}, body.encode()


def _search_form(words: str) -> str:
    return ('<form method="get" action="/search" role="search"><label for="q">Search products</label> '
            f'<input id="q" name="q" type="search" value="{_e(words)}"> <button type="submit">Search</button>'
            "</form>")


def _product_list(products: list[Product]) -> str:
    items = "".join(f'<li><a href="/product/{p.id}">{_e(p.name)}</a>: {format_price(p.price_cents)}. '
                    + "; ".join(f"{name.capitalize()}: {', '.join(values)}" for name, _, values in p.options)
                    + "</li>" for p in products)
    return f"<ul>{items}</ul>"


def _option_control(name: str, widget: str, values: tuple[str, ...], chosen: str | None) -> str:
    label = name.capitalize()
    if widget == "select":
        choices = "".join(f'<option{" selected" if v == chosen else ""}>{_e(v)}</option>' for v in values)
        return (f'<p><label for="option-{name}">{label}</label> <select id="option-{name}" name="{name}">'
                f'<option value="">Choose a {name}</option>{choices}</select></p>')
    radios = "".join(f'<input type="radio" id="option-{name}-{i}" name="{name}" value="{_e(v)}"'
                     f'{" checked" if v == chosen else ""}> <label for="option-{name}-{i}">{_e(v)}</label> '
                     for i, v in enumerate(values))
    return f"<fieldset><legend>{label}</legend>{radios}</fieldset>"


def _text_input(key: str, label: str, value: str | None) -> str:
    return (f'<p><label for="{key}">{label}</label> <input id="{key}" name="{key}" type="text" maxlength="100" '
            f'value="{_e(value or "")}"></p>')


# -- tasks ----------------------------------------------------------------------------------------
Built = tuple[str, list[dict[str, Any]], dict[str, str]]  # goal, target lines, target shipping


def generate_task(index: int) -> dict[str, Any]:
    """Task `index` (any int >= 0): the family cycles with the index, the site seed is 2*index (+1 for a
    family that starts from a pre-filled cart), so every index has its own shop and its own goal."""
    if type(index) is not int or index < 0:
        raise ValueError(f"expected a task index: an int >= 0, got {index!r}")
    family = FAMILIES[index % len(FAMILIES)]
    site_seed = 2 * index + (family == "cart_edit")
    goal, lines, shipping = _BUILDERS[family](Site(site_seed), random.Random(f"shop/{index}/task"))
    return {"site": Site.name, "site_seed": site_seed, "goal": goal, "start_path": "/",
            "check": {"family": family, "lines": lines, "shipping": shipping}}


def _target(product: Product, options: dict[str, str], quantity: int) -> dict[str, Any]:
    return {"product_id": product.id, "name": product.name, "options": options, "quantity": quantity}


def _pick_options(rng: random.Random, product: Product, **fixed: str) -> dict[str, str]:
    return {name: fixed.get(name) or rng.choice(values) for name, _, values in product.options}


def _ship_to(rng: random.Random) -> tuple[str, dict[str, str]]:
    address = draw_address(rng)
    method = rng.choice(SHIPPING_METHODS)[0]
    text = (f"Ship to {address['full_name']}, {address['street']}, {address['city']}, postcode "
            f"{address['postcode']}, {address['country']}, by {method} shipping.")
    return text, {**address, "method": method}


def _cheapest(site: Site, rng: random.Random) -> Built:
    category = rng.choice([c for c in CATEGORIES if any(spec.name == "colour" for spec in c.options)])
    offering: dict[str, list[Product]] = {}
    for product in (p for p in site.catalogue if p.category is category):
        for colour in dict((name, values) for name, _, values in product.options)["colour"]:
            offering.setdefault(colour, []).append(product)
    contested = sorted(c for c, products in offering.items() if len(products) > 1) or sorted(offering)
    colour = rng.choice(contested)
    extreme = rng.choice(("cheapest", "most expensive"))
    pick = min if extreme == "cheapest" else max
    product = pick(offering[colour], key=lambda p: p.price_cents)
    options, quantity = _pick_options(rng, product, colour=colour), rng.randint(1, 3)
    ship, shipping = _ship_to(rng)
    goal = (f"Find the {extreme} {category.singular} that comes in {colour} and order it: "
            f"{describe_options(options)}, quantity {quantity}. {ship}")
    return goal, [_target(product, options, quantity)], shipping


def _priciest_under(site: Site, rng: random.Random) -> Built:
    category = rng.choice(CATEGORIES)
    ranked = sorted((p for p in site.catalogue if p.category is category), key=lambda p: p.price_cents)
    position = rng.randrange(1, len(ranked))
    product = ranked[position]
    limit = (product.price_cents // 100 + 1) * 100
    if position + 1 < len(ranked) and ranked[position + 1].price_cents <= limit:
        limit = ranked[position + 1].price_cents  # "less than" the next one up: the target stays the answer
    options, quantity = _pick_options(rng, product), rng.randint(1, 3)
    ship, shipping = _ship_to(rng)
    goal = (f"Order the most expensive {category.singular} that costs less than {format_price(limit)}: "
            f"{describe_options(options)}, quantity {quantity}. {ship}")
    return goal, [_target(product, options, quantity)], shipping


def _description(site: Site, rng: random.Random) -> Built:
    product = rng.choice(site.catalogue)
    options, quantity = _pick_options(rng, product), rng.randint(1, 3)
    ship, shipping = _ship_to(rng)
    goal = (f'Order the product whose description mentions "{product.feature}": '
            f"{describe_options(options)}, quantity {quantity}. {ship}")
    return goal, [_target(product, options, quantity)], shipping


def _pair(site: Site, rng: random.Random) -> Built:
    first = rng.choice(site.catalogue)
    second = rng.choice([p for p in site.catalogue if p.category is not first.category])
    lines = [_target(p, _pick_options(rng, p), rng.randint(1, 3)) for p in (first, second)]
    wanted = " and ".join(f"{line['quantity']} of the {line['name']} ({describe_options(line['options'])})"
                          for line in lines)
    ship, shipping = _ship_to(rng)
    return f"Buy {wanted}, in one order. {ship}", lines, shipping


def _reorder(site: Site, rng: random.Random) -> Built:
    order = rng.choice(site.state()["orders"])
    lines = [{key: line[key] for key in ("product_id", "name", "options", "quantity")} for line in order["lines"]]
    goal = (f"Place a new order with exactly the same items as your order #{order['number']} of {order['date']} "
            "(the same products, options and quantities).")
    if rng.random() < 0.5:  # the address is on the old order's page only
        method = rng.choice(SHIPPING_METHODS)[0]
        return (f"{goal} Ship it to the same address as that order, by {method} shipping.", lines,
                {**order["shipping"], "method": method})
    ship, shipping = _ship_to(rng)
    return f"{goal} {ship}", lines, shipping


def _cart_edit(site: Site, rng: random.Random) -> Built:
    remove, change, keep = rng.sample(site.state()["cart"], k=3)
    quantity = rng.choice([q for q in range(1, 5) if q != change["quantity"]])
    lines = [{key: line[key] for key in ("product_id", "name", "options", "quantity")} for line in (keep, change)]
    lines[1]["quantity"] = quantity
    add = ""
    if rng.random() < 0.5:
        in_cart = {line["product_id"] for line in (remove, change, keep)}
        product = rng.choice([p for p in site.catalogue if p.id not in in_cart])
        lines.append(_target(product, _pick_options(rng, product), rng.randint(1, 2)))
        add = f", add {lines[2]['quantity']} of the {product.name} ({describe_options(lines[2]['options'])})"
    ship, shipping = _ship_to(rng)
    goal = (f"Your cart already holds some items. Remove the {remove['name']}, change the quantity of the "
            f"{change['name']} to {quantity}{add}, keep the rest as it is, and check out. {ship}")
    return goal, lines, shipping


_BUILDERS: dict[str, Callable[[Site, random.Random], Built]] = {
    "cheapest": _cheapest, "priciest_under": _priciest_under, "description": _description,
    "pair": _pair, "reorder": _reorder, "cart_edit": _cart_edit}
FAMILIES = tuple(_BUILDERS)


# -- verification ---------------------------------------------------------------------------------
LineKey = tuple[int, tuple[tuple[str, str], ...]]


def verify(check: dict[str, Any], state: dict[str, Any]) -> tuple[float, str]:
    """Score from the shop's state alone; the rules are in the module docstring."""
    try:
        want, names = _line_counts(check["lines"])
        placed = [order for order in state["orders"] if order["seeded"] is not True]
        if not placed:
            return 0.0, "no order was placed"
        if len(placed) > 1:
            numbers = ", ".join(f"#{order['number']}" for order in placed)
            return 0.0, f"{len(placed)} orders were placed ({numbers}); the task asks for exactly one"
        order = placed[0]
        got, got_names = _line_counts(order["lines"])
        if got != want:
            return 0.0, (f"order #{order['number']} holds {_describe(got, {**names, **got_names})}; the task "
                         f"wants {_describe(want, names)}")
        wrong = [key for key in SHIPPING_FIELDS
                 if _normal(order["shipping"][key]) != _normal(check["shipping"][key])]
        if wrong:
            return 0.5, f"order #{order['number']} has the right items but a wrong {', '.join(wrong)}"
        return 1.0, f"order #{order['number']} matches the task"
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        return 0.0, f"malformed check or state: {type(error).__name__}: {error}"


def _line_counts(lines: list[dict[str, Any]]) -> tuple[dict[LineKey, int], dict[LineKey, str]]:
    counts: dict[LineKey, int] = {}
    names: dict[LineKey, str] = {}
    for line in lines:
        options = line["options"]
        if type(line["product_id"]) is not int or type(line["quantity"]) is not int or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in options.items()):
            raise ValueError(f"expected a line of int product_id, int quantity and text options, got {line!r}")
        key = (line["product_id"], tuple(sorted(options.items())))
        counts[key] = counts.get(key, 0) + line["quantity"]
        names[key] = str(line.get("name", f"product {line['product_id']}"))
    return counts, names


def _describe(counts: dict[LineKey, int], names: dict[LineKey, str]) -> str:
    return "; ".join(f"{quantity} x {names[key]} ({', '.join(f'{k} {v}' for k, v in key[1])})"
                     for key, quantity in sorted(counts.items())) or "nothing"


def _normal(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a shipping field as text, got {value!r}")
    return " ".join(value.split()).casefold()
