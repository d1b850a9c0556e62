"""What ``python -m bench.grammar`` checks of each library, untimed but for compiles: each
format compiled (timed, up to 3 times while that is quick), its valid instance walked token by
token (each allowed, no special token before the JSON is complete, the stop tokens after it),
where its invalid instance is refused, and what the library says of schemas it may not compile.
"""

from __future__ import annotations

import functools
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
from wschat.server.engine.local.grammar_mask import allocate_bitmask, token_allowed

from .grammar_libs import ANY_OBJECT, Library, Refused

COMPILE_BUDGET_S = 20.0  # repeat a compile up to 3 times while the repeats take less than this
ERROR_BUDGET_S = 120.0  # an uncompilable schema still compiling after this is reported as such
LISTED = 8  # special ids listed in the results (the count is there too)


def schema_of(response_format: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """The JSON schema a response format constrains to, and whether it is strict."""
    if response_format["type"] == "json_object":
        return ANY_OBJECT, False
    spec = response_format["json_schema"]
    return spec["schema"], bool(spec.get("strict", False))


def ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def timed(work: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    value = work()
    return value, time.perf_counter() - start


def _listed(ids: list[int]) -> dict[str, Any]:
    return {"count": len(ids), "first": ids[:LISTED]}


def _special_allowed(bitmask: torch.Tensor, special: torch.Tensor) -> list[int]:
    bits = (bitmask[0, special // 32] >> (special % 32)) & 1
    return special[bits.bool()].tolist()


def check(
    lib: Library,
    compiled: Any,
    ids: dict[str, list[int]],
    special: torch.Tensor,
    stop_ids: list[int],
    tokenizer: Any,
    vocab: int,
) -> dict[str, Any]:
    """Walk the valid instance (each token allowed, no special token until it is complete)
    and the invalid one (where the library refuses it)."""
    bitmask = allocate_bitmask(1, vocab)
    matcher = lib.matcher(compiled)
    refused_valid, special_early = [], []
    for i, token in enumerate(ids["valid"]):
        lib.fill(matcher, bitmask, 0)
        if not token_allowed(bitmask, 0, token):
            refused_valid.append(i)
        special_early += _special_allowed(bitmask, special)
        if not lib.advance(matcher, token):
            refused_valid.append(i)
            break
    lib.fill(matcher, bitmask, 0)
    at_end = _special_allowed(bitmask, special)
    result: dict[str, Any] = {
        "valid_tokens": len(ids["valid"]),
        "valid_refused_at": sorted(set(refused_valid)),
        "special_allowed_before_end": _listed(sorted(set(special_early))),
        "special_allowed_at_end": _listed(at_end),
        "stop_ids_allowed_at_end": [s for s in stop_ids if s in at_end],
        "complete_at_end": lib.accepting(matcher),
    }
    matcher = lib.matcher(compiled)
    for i, token in enumerate(ids["invalid"]):
        lib.fill(matcher, bitmask, 0)
        allowed = token_allowed(bitmask, 0, token)
        if not allowed or not lib.advance(matcher, token):
            result["invalid_refused"] = {
                "after": tokenizer.decode(ids["invalid"][:i]),
                "token": tokenizer.decode([token]),
                "in_mask": allowed,
            }
            break
    else:
        result["invalid_refused"] = None
    return result


def compile_all(
    lib: Library, formats: list[dict[str, Any]]
) -> tuple[dict[str, Any], dict[str, Any]]:
    compiled, report = {}, {}
    for entry in formats:
        schema, strict = schema_of(entry["response_format"])
        seconds: list[float] = []
        try:
            while len(seconds) < 3 and sum(seconds) < COMPILE_BUDGET_S:
                compiled[entry["name"]], spent = timed(
                    functools.partial(lib.compile, schema, strict)
                )
                seconds.append(spent)
            report[entry["name"]] = {
                "ms": [ms(s) for s in seconds],
                "median_ms": ms(statistics.median(seconds)),
            }
        except Refused as error:
            report[entry["name"]] = {"refused": str(error)}
    return compiled, report


def uncompilable(formats_doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    cases = {c["name"]: c["schema"] for c in formats_doc["uncompilable"]}
    cases["huge_enum"] = {
        "type": "object",
        "properties": {"v": {"enum": [f"value-{i:05d}" for i in range(10_000)]}},
        "required": ["v"],
    }
    deep: dict[str, Any] = {"type": "string"}
    for _ in range(200):
        deep = {"type": "object", "properties": {"v": deep}, "required": ["v"]}
    cases["nested_200_deep"] = deep
    return cases


def try_compile(lib: Library, schema: dict[str, Any]) -> dict[str, Any]:
    """The library's verdict on ``schema`` (strict), waiting at most ``ERROR_BUDGET_S``."""
    verdict: dict[str, Any] = {}

    def work() -> None:
        start = time.perf_counter()
        try:
            lib.compile(schema, True)
            verdict["compiled"] = True
        except Refused as error:
            verdict["refused"] = str(error)
        except Exception as error:  # a library's own exception type: recorded as it is
            verdict["raised"] = f"{type(error).__name__}: {error}"
        verdict["ms"] = ms(time.perf_counter() - start)

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    worker.join(ERROR_BUDGET_S)
    return verdict or {"still_compiling_after_s": ERROR_BUDGET_S}
