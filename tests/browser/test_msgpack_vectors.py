"""``protocol/msgpack.mjs`` in the browser against the shared vectors of the Python codec.

Each vector that is valid msgpack must decode to the value ``vectors.json`` states and encode
back to the bytes Python's msgpack writes for that value (the vector's own bytes when it is
canonical); each invalid one must be refused. PROTOCOL.md "Test vectors" describes the format.
"""

from __future__ import annotations

import base64
import json
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

CHECK_IN_PAGE = """async ({vectors, files, python}) => {
  const { decode, encode, Float64 } = await import("/static/msgpack.mjs");
  const bytes = (b64) => Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  const b64 = (u8) => btoa(String.fromCharCode(...u8));
  const tagged = (v) => {
    if (v instanceof Float64) {
      const x = v.value;
      return { $float: Number.isFinite(x) ? x : String(x) };
    }
    if (typeof v === "bigint") return { $int: v.toString() };
    if (v instanceof Uint8Array) return { $bin: b64(v) };
    if (Array.isArray(v)) return v.map(tagged);
    if (v instanceof Map) return Object.fromEntries([...v].map(([k, x]) => [k, tagged(x)]));
    return v;
  };
  const same = (a, b) => {
    if (typeof a === "number" && typeof b === "number") return Object.is(a, b);
    if (a === null || b === null || typeof a !== "object" || typeof b !== "object") return a === b;
    if (Array.isArray(a) !== Array.isArray(b)) return false;
    const ka = Object.keys(a), kb = Object.keys(b);
    return ka.length === kb.length && ka.every((k, i) => k === kb[i] && same(a[k], b[k]));
  };
  const failures = [];
  let checked = 0;
  for (const v of vectors) {
    const data = bytes(files[v.name]);
    let value;
    try {
      value = decode(data, { lossless: true });
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
    if (b64(encode(value)) !== python[v.name]) {
      failures.push(`${v.name}: encoded to ${b64(encode(value))}`);
      continue;
    }
    decode(data); // the everyday (lossy) form decodes as well
    checked++;
  }
  return { checked, failures };
}"""


def _python_encoding(vector: dict[str, Any]) -> str:
    packed = msgpack.packb(from_json(vector["value"]), use_bin_type=True)
    return base64.b64encode(packed).decode("ascii")


async def test_msgpack_module_decodes_and_encodes_every_vector_as_python_does(
    new_page: NewPage,
) -> None:
    document = json.loads((VECTORS / "vectors.json").read_text(encoding="utf-8"))
    vectors = document["vectors"]
    assert len(vectors) >= 100 and document["limits"]["max_depth"] == 1024
    files = {
        v["name"]: base64.b64encode((VECTORS / v["file"]).read_bytes()).decode() for v in vectors
    }
    python = {v["name"]: _python_encoding(v) for v in vectors if v["msgpack_valid"]}
    for v in vectors:
        if v["msgpack_valid"] and v["canonical"]:
            assert python[v["name"]] == files[v["name"]], v["name"]
    async with running_server(ScriptedEngine()) as url:
        page = await new_page()
        await page.goto(http_base(url) + "/")
        result = await page.evaluate(
            CHECK_IN_PAGE, {"vectors": vectors, "files": files, "python": python}
        )
    assert result["failures"] == []
    assert result["checked"] == len(vectors)
