"""The one loader for spec and run-config files: safe YAML with limits, JSON with a depth bound,
UTF-8 or a byte-order mark, one line per problem."""

from __future__ import annotations

import codecs
import json
from pathlib import Path

import pytest
from pydantic import BaseModel

from core.config_files import MAX_DOCUMENT_BYTES, DataLimitError, check_data, load_data_text, load_model_file
from core.errors import ConfigError

BILLION_LAUGHS = "\n".join(
    [f"l0: &l0 [{', '.join(['lol'] * 9)}]"]
    + [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 9)]
)  # 9**9 = 387 million strings once expanded, from a few hundred bytes


class Spec(BaseModel):
    name: str
    extra: object = None


@pytest.mark.parametrize(("text", "message"), [
    (BILLION_LAUGHS, "expected YAML without anchors, got &l0 at line 1"),
    ("base: &b {x: 1}\nother:\n  <<: *b\n", "expected YAML without anchors, got &b"),
    ("a: " + "[" * 65 + "]" * 65, "expected nesting at most 64 deep"),
    ("a: " + "{b: " * 200 + "1" + "}" * 200, "expected nesting at most 64 deep"),
    ('a: "\\ud800"', "a: expected text, got a lone UTF-16 surrogate '\\ud800' at character 0"),
    ("!!python/object/apply:os.system ['true']", "expected valid YAML"),
])
def test_yaml_limits(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_data_text(text, source="spec.yaml")
    assert message in str(caught.value) and str(caught.value).startswith("spec.yaml: ")


def test_json_nested_past_the_recursion_limit_is_one_error_not_a_crash() -> None:
    with pytest.raises(DataLimitError, match="expected nesting at most 64 deep, got far deeper"):
        load_data_text("[" * 200_000 + "]" * 200_000, source="spec.json", json_only=True)


def test_check_data_is_iterative_and_names_the_path() -> None:
    deep: list = []
    node = deep
    for _ in range(50_000):  # deeper than Python's recursion limit
        node.append([])
        node = node[0]
    with pytest.raises(DataLimitError, match=r"expected nesting at most 64 deep, got deeper at \[0\]"):
        check_data(deep, source="x")
    with pytest.raises(DataLimitError, match=r"a\.b: expected a string of at most 10 characters, got 11"):
        check_data({"a": {"b": "x" * 11}}, source="x", max_string=10)


@pytest.mark.parametrize("encoding", ["utf-8-sig", "utf-16", "utf-32"])
def test_a_byte_order_mark_says_the_encoding(tmp_path: Path, encoding: str) -> None:
    path = tmp_path / "spec.yaml"
    path.write_bytes("name: café\n".encode(encoding))
    assert load_model_file(Spec, path, what="spec file").name == "café"


def test_utf16_without_a_mark_and_oversized_files_are_one_line(tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_bytes("name: x\n".encode("utf-16-le"))
    with pytest.raises(ConfigError, match="expected valid YAML: unacceptable character #x0000"):
        load_model_file(Spec, path, what="spec file")
    path.write_bytes(b"name: x\nextra: '" + b"x" * MAX_DOCUMENT_BYTES + b"'\n")
    with pytest.raises(DataLimitError, match=f"expected a spec file of at most {MAX_DOCUMENT_BYTES} bytes"):
        load_model_file(Spec, path, what="spec file")


def test_a_valid_file_loads(tmp_path: Path) -> None:
    (tmp_path / "spec.json").write_text(json.dumps({"name": "calc", "extra": {"deep": [[1]]}}))
    assert load_model_file(Spec, tmp_path / "spec.json", what="spec file").extra == {"deep": [[1]]}
    (tmp_path / "spec.yaml").write_bytes(codecs.BOM_UTF8 + b"name: calc\n")
    assert load_model_file(Spec, tmp_path / "spec.yaml", what="spec file").name == "calc"
