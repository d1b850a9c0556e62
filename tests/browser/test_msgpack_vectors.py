"""The pages' msgpack (``server/web/static/msgpack.js``: the vendored ``@msgpack/msgpack`` held
to the protocol's rules) in the browser against the shared vectors of the Python codec.

Each vector that is valid msgpack must decode to the value ``vectors.json`` states (a JavaScript
Number for an int up to 2^53 and for a float, a BigInt for an int beyond, a Uint8Array for bin)
and encode to bytes Python's msgpack decodes to that value again, but for a float that is a whole
number, which goes out as an int as every JavaScript encoder sends it (PROTOCOL.md "Transport":
a float field accepts an int). Each invalid one must be refused. PROTOCOL.md "Test vectors"
describes the format.
"""

from __future__ import annotations

import base64
import json
import math
from pathlib import Path
from typing import Any

import msgpack
import pytest

from tests.fakes.scripted import ScriptedEngine
from tests.protocol.make_vectors import from_json
from tests.support import running_server

from .conftest import NewPage, http_base

pytestmark = pytest.mark.browser

VECTORS = Path(__file__).resolve().parents[2] / "protocol" / "vectors"

CHECK_IN_PAGE = """async ({vectors, files}) => {
  const { decode, encode } = await import("/static/msgpack.js");
  const bytes = (b64) => Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  const b64 = (u8) => btoa(String.fromCharCode(...u8));
  const tagged = (v) => {
    if (typeof v === "bigint") return { $int: v.toString() };
    if (v instanceof Uint8Array) return { $bin: b64(v) };
    if (Array.isArray(v)) return v.map(tagged);
    if (v !== null && typeof v === "object") {
      return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, tagged(x)]));
    }
    return v;
  };
  // expected: the vector's JSON, where a float is {$float: x}; got: what decode gave, tagged
  const same = (got, expected) => {
    if (expected !== null && typeof expected === "object" && "$float" in expected) {
      return typeof got === "number" && Object.is(got, Number(expected.$float));
    }
    if (typeof expected === "number") return Object.is(got, expected);
    const objects = [got, expected].every((x) => x !== null && typeof x === "object");
    if (!objects) return got === expected;
    if (Array.isArray(got) !== Array.isArray(expected)) return false;
    const keys = Object.keys(expected);
    if (keys.length !== Object.keys(got).length) return false;
    return keys.every((k) => k in got && same(got[k], expected[k]));
  };
  const failures = [];
  const encoded = {};
  let checked = 0;
  for (const v of vectors) {
    let value;
    try {
      value = decode(bytes(files[v.name]));
    } catch (error) {
      if (v.msgpack_valid) failures.push(`${v.name}: refused: ${error.message}`);
      else checked++;
      continue;
    }
    if (!v.msgpack_valid) {
      failures.push(`${v.name}: decoded, but it is not valid msgpack`);
      continue;
    }
    if (!same(tagged(value), v.value)) {
      failures.push(`${v.name}: decoded to ${JSON.stringify(tagged(value))}`);
      continue;
    }
    encoded[v.name] = b64(encode(value));
    checked++;
  }
  return { checked, failures, encoded };
}"""


def same(got: Any, expected: Any) -> bool:
    """``got`` (what Python decodes of the browser's bytes) is ``expected``, a float that is a
    whole number allowed as that int."""
    if isinstance(got, bool) or isinstance(expected, bool):
        return type(got) is type(expected) and got == expected
    if isinstance(expected, float) and isinstance(got, int | float):
        return got == expected or (
            math.isnan(expected) and isinstance(got, float) and math.isnan(got)
        )
    if isinstance(expected, dict) and isinstance(got, dict):
        return got.keys() == expected.keys() and all(same(got[k], expected[k]) for k in expected)
    if isinstance(expected, list) and isinstance(got, list):
        return len(got) == len(expected) and all(map(same, got, expected))
    return type(got) is type(expected) and got == expected


def test_the_python_side_comparison_allows_only_a_whole_float_as_an_int() -> None:
    assert same({"t": [1, 2.5, float("nan"), b"x"]}, {"t": [1.0, 2.5, float("nan"), b"x"]})
    assert not same(2, 2.5) and not same(1, True) and not same(1.0, 1) and not same("1", 1)
    assert not same({"a": 1}, {"a": 1, "b": None}) and not same([1], [1, 1])


async def test_the_pages_msgpack_decodes_each_vector_and_python_reads_what_it_encodes(
    new_page: NewPage,
) -> None:
    document = json.loads((VECTORS / "vectors.json").read_text(encoding="utf-8"))
    vectors = document["vectors"]
    assert len(vectors) >= 100 and document["limits"]["max_depth"] == 1024
    files = {
        v["name"]: base64.b64encode((VECTORS / v["file"]).read_bytes()).decode() for v in vectors
    }
    async with running_server(ScriptedEngine()) as url:
        page = await new_page()
        await page.goto(http_base(url) + "/")
        result = await page.evaluate(CHECK_IN_PAGE, {"vectors": vectors, "files": files})
    assert result["failures"] == []
    assert result["checked"] == len(vectors)
    valid = [v for v in vectors if v["msgpack_valid"]]
    assert sorted(result["encoded"]) == sorted(v["name"] for v in valid)
    misread = [
        v["name"]
        for v in valid
        if not same(
            msgpack.unpackb(base64.b64decode(result["encoded"][v["name"]])), from_json(v["value"])
        )
    ]
    assert misread == []
