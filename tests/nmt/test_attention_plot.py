"""The SVG heat maps of `nmt.attention_plot` against matplotlib's viridis and the maps they draw."""

from xml.etree import ElementTree

import numpy as np
import pytest

from nmt.attention_plot import attention_svg, check_path, color, plot_attention

SVG = "{http://www.w3.org/2000/svg}"


def _rgb(hex_color: str) -> np.ndarray:
    return np.array([int(hex_color[i : i + 2], 16) for i in (1, 3, 5)])


def test_colors_follow_matplotlibs_viridis():
    # matplotlib.colormaps["viridis"](w) for these weights (its 256-entry table), rounded to bytes
    reference = {
        0.0: "#440154", 0.1: "#482475", 0.3: "#355f8d", 0.45: "#25848e", 0.55: "#1e9c89", 0.7: "#44bf70",
        0.9: "#bddf26", 1.0: "#fde725",
    }  # fmt: skip
    for weight, expected in reference.items():
        assert np.abs(_rgb(color(weight)) - _rgb(expected)).max() <= 3, (weight, color(weight), expected)
    assert color(-1.0) == color(0.0) and color(7.0) == color(1.0)  # clipped


def _maps(layers=2, heads=3, target=("Ein", "Hund", "</s>"), source=("A", "<dog>", "&", "</s>")):
    rng = np.random.default_rng(0)
    weights = [rng.dirichlet(np.ones(len(source)), size=(heads, len(target))) for _ in range(layers)]
    return {"source": list(source), "target": list(target), "translation": "Ein Hund", "weights": weights}


def test_every_cell_has_the_color_and_value_of_its_weight_and_labels_are_escaped(tmp_path):
    maps = _maps()
    path = tmp_path / "maps.svg"
    plot_attention(path, maps)
    root = ElementTree.parse(path).getroot()  # well-formed, so "<dog>" and "&" were escaped
    cells = root.findall(f"{SVG}rect")[1:]  # the first one is the background
    expected = [
        float(layer[head, row, column])
        for layer in maps["weights"]
        for head in range(3)
        for row in range(3)
        for column in range(4)
    ]
    assert len(cells) == len(expected) == 2 * 3 * 3 * 4
    assert [cell.get("fill") for cell in cells] == [color(value) for value in expected]
    assert [float(cell.find(f"{SVG}title").text) for cell in cells] == pytest.approx(expected, abs=5e-4)
    texts = [text.text for text in root.iter(f"{SVG}text")]
    assert texts.count("<dog>") == 6 and texts.count("Hund") == 6  # one label per panel
    assert "layer 2, head 3" in texts and texts[0] == "Ein Hund"
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left


def test_title_overrides_the_translation():
    root = ElementTree.fromstring(attention_svg(_maps(layers=1, heads=1), title="a < b"))
    assert next(root.iter(f"{SVG}text")).text == "a < b"


@pytest.mark.parametrize("name", ["maps.png", "maps", "maps.svg.txt"])
def test_other_formats_are_refused_before_anything_is_written(tmp_path, name):
    with pytest.raises(ValueError, match=r"ending in \.svg"):
        check_path(tmp_path / name)
    with pytest.raises(ValueError, match=r"ending in \.svg"):
        plot_attention(tmp_path / name, _maps())
    assert list(tmp_path.iterdir()) == []


def test_a_failed_write_leaves_nothing(tmp_path, monkeypatch):
    import nmt.attention_plot as attention_plot

    def full_disk(*_):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(attention_plot.os, "replace", full_disk)
    with pytest.raises(OSError, match="No space left"):
        plot_attention(tmp_path / "maps.svg", _maps())
    assert list(tmp_path.iterdir()) == []
