import sys

sys.path.insert(0, "/app")

from calc import add


def test_add():
    assert add(2, 3) == 5


def test_add_negative():
    assert add(-1, -1) == -2
