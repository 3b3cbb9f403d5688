"""BrowserGym's action text and argument names (environments/browser/actions.py): what a BrowserGym
agent writes becomes the kind's tool call, nothing in the text is evaluated, and every malformed or
hostile action is one readable error the agent sees. The actions driven in a real browser:
tests/environments/browser/test_browser_episodes.py."""

from __future__ import annotations

import pytest

from core.errors import ConfigError
from environments.base import ToolCall
from environments.browser.actions import SIGNATURES, canonical, parse_browsergym
from environments.browser.kind import TOOL_SCHEMAS
from environments.parsing import PARSERS, MalformedToolCall, hermes_call


@pytest.mark.parametrize(("text", "expected"), [
    ('click("12")', ToolCall("click", {"bid": "12"})),
    ("I will press the button.\nclick('12')\n", ToolCall("click", {"bid": "12"})),
    ('```\nfill("7", "Alice")\n```', ToolCall("fill", {"bid": "7", "value": "Alice"})),
    ('select_option("9", ["Red", "Blue"])', ToolCall("select_option", {"bid": "9", "options": ["Red", "Blue"]})),
    ('press("7", key_comb="Control+a")', ToolCall("press", {"bid": "7", "key_comb": "Control+a"})),
    ("scroll(0, -200.5)", ToolCall("scroll", {"delta_x": 0, "delta_y": -200.5})),
    ('drag_and_drop("3", "8")', ToolCall("drag_and_drop", {"from_bid": "3", "to_bid": "8"})),
    ("mouse_click(120, 40)", ToolCall("mouse_click", {"x": 120, "y": 40})),
    ('hover("4")<|im_end|>', ToolCall("hover", {"bid": "4"})),  # the stop token, where a server leaves it in
    ('send_msg_to_user("42")', ToolCall("send_msg_to_user", {"text": "42"})),
    ("go_back()", ToolCall("go_back", {})),
    ("The page is empty; nothing to do.", None),
    ("print('click(\"1\")')", None),  # not an action: only a line that is one call to a known action counts
    (hermes_call("click", bid="5"), ToolCall("click", {"bid": "5"})),  # Hermes calls still work
])
def test_browsergym_text_actions_parse(text: str, expected: ToolCall | None) -> None:
    assert PARSERS["browsergym"](text) == expected


@pytest.mark.parametrize(("text", "message"), [
    ('click("12", "left", [], "extra")', "click: expected at most 3 arguments (bid, button, modifiers), got 4"),
    ('click(bid="1", target="x")', "click: expected arguments among bid, button, modifiers, got 'target'"),
    ('click("1", bid="2")', "click: got 'bid' twice"),
    ('click(__import__("os").system("id"))', "click: expected literal arguments"),
    ("fill(\"1\", open('/etc/passwd').read())", "fill: expected literal arguments"),
    ('click(**{"bid": "1"})', "click: expected arguments among bid, button, modifiers, got None"),
    ("scroll(" + "[" * 300 + "]" * 300 + ", 0)", "action: expected one call like scroll(...)"),  # too deep to parse
    ("noop(" + "9" * 5000 + ")", "action: expected one call like noop(...)"),  # past Python's 4,300 digits
    ('click("12"', None),  # not closed: no action at all (the agent is told there was no tool call)
    ('click("12") and click("13")', "action: expected one call like click(...)"),
])
def test_malformed_and_hostile_actions_are_one_readable_error(text: str, message: str | None) -> None:
    if message is None:
        assert parse_browsergym(text) is None
        return
    with pytest.raises(MalformedToolCall) as raised:
        parse_browsergym(text)
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_browsergym_names_become_the_kinds_and_only_the_left_button_is_driven() -> None:
    assert canonical(ToolCall("fill", {"bid": "7", "value": "x"})) == ToolCall("fill", {"bid": "7", "text": "x"})
    assert canonical(ToolCall("select_option", {"bid": "9", "options": ["R"]})) == \
        ToolCall("select_option", {"bid": "9", "option": ["R"]})
    assert canonical(ToolCall("press", {"bid": "7", "key_comb": "Enter"})) == ToolCall("press", {"bid": "7", "key": "Enter"})
    assert canonical(ToolCall("scroll", {"delta_x": 0, "delta_y": 5})) == ToolCall("scroll", {"dx": 0, "dy": 5})
    assert canonical(ToolCall("click", {"bid": "1", "button": "left", "modifiers": []})) == ToolCall("click", {"bid": "1"})
    assert canonical(ToolCall("send_msg_to_user", {"text": "42"})) == ToolCall("submit", {"answer": "42"})
    for call, message in [
        (ToolCall("click", {"bid": "1", "button": "right"}), 'click: expected button "left"'),
        (ToolCall("click", {"bid": "1", "modifiers": ["Shift"]}), "click: expected no modifiers"),
        (ToolCall("fill", {"bid": "1", "value": "a", "text": "b"}), "fill: expected 'value' or 'text', got both"),
    ]:
        with pytest.raises(MalformedToolCall, match=message):
            canonical(call)


def test_every_browsergym_action_is_a_tool_of_the_kind() -> None:
    from environments.browser.kind import DEFAULT_TOOLS, BrowserKind
    from environments.spec import parse_spec

    assert set(SIGNATURES) == set(TOOL_SCHEMAS) and set(DEFAULT_TOOLS) < set(TOOL_SCHEMAS)
    # A spec without `tools` keeps the short default set; one that names BrowserGym's actions gets them.
    base = {"name": "web", "kind": "browser", "image": "browser"}
    assert [t["function"]["name"] for t in BrowserKind(parse_spec(base)).tools()] == list(DEFAULT_TOOLS)
    named = BrowserKind(parse_spec({**base, "tools": ["drag_and_drop", "send_msg_to_user"]}))
    assert [t["function"]["name"] for t in named.tools()] == ["drag_and_drop", "send_msg_to_user"]


@pytest.mark.parametrize("call", [
    ToolCall("click", {"bid": "12"}), ToolCall("fill", {"bid": "7", "text": "O'Brien \"Al\"\n"}),
    ToolCall("select_option", {"bid": "9", "option": ["Red", "Blue"]}), ToolCall("press", {"bid": "1", "key": "Enter"}),
    ToolCall("scroll", {"dx": 0, "dy": -40}), ToolCall("drag_and_drop", {"from_bid": "3", "to_bid": "8"}),
    ToolCall("mouse_drag_and_drop", {"from_x": 1, "from_y": 2, "to_x": 3.5, "to_y": 4}), ToolCall("go_back", {}),
    ToolCall("noop", {"wait_ms": 10}), ToolCall("submit", {"answer": "42"}),
])
def test_the_text_form_reads_back_as_the_same_action(call: ToolCall) -> None:
    from environments.browser.actions import browsergym_text

    text = browsergym_text(call)
    assert "\n" not in text and "<tool_call>" not in text
    assert canonical(parse_browsergym(f"Thinking it over.\n{text}")) == canonical(call)  # type: ignore[arg-type]


def test_browsergym_conventions_are_an_option_of_the_spec() -> None:
    from environments.browser.kind import BROWSERGYM_PROMPT, SYSTEM_PROMPT, BrowserKind, browsergym_tree
    from environments.spec import parse_spec

    base = {"name": "web", "kind": "browser", "image": "browser"}
    assert BrowserKind(parse_spec(base)).system_prompt() == SYSTEM_PROMPT
    gym = BrowserKind(parse_spec({**base, "tool_parser": "browsergym", "browser": {"tree": "browsergym"}}))
    assert gym.system_prompt() == BROWSERGYM_PROMPT and 'click("12")' in BROWSERGYM_PROMPT
    tree = "RootWebArea 'Shop', focused\n  [12] link 'Shirts'\n    [15] textbox 'Qty', value='1', required\n" \
           "    StaticText 'In stock,   value=2'"
    assert browsergym_tree(tree) == "RootWebArea 'Shop', focused\n\t[12] link 'Shirts'\n\t\t[15] textbox 'Qty' " \
        "value='1', required\n\t\tStaticText 'In stock,   value=2'"
    with pytest.raises(ConfigError, match=r"browser\.tree: Input should be .crucible. or .browsergym."):
        parse_spec({**base, "browser": {"tree": "xml"}})
    with pytest.raises(ConfigError, match=r"browser\.reward: Input should be .raw. or .success."):
        parse_spec({**base, "browser": {"reward": "shaped"}})
