from calc import mul


def test_mul():
    assert mul(3, 4) == 12
