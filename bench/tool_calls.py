"""``python -m bench --only tools``: tool calls on the embedded model, through the official
``openai`` SDK against wschat's chat completions API (issue 36).

Ten functions (nested objects, enums, arrays, bounded numbers, no arguments) and fifty requests,
five per function, each written for one of them; every request offers all ten, one call per
reply (``parallel_tool_calls`` false), on the server's default prompt format (the base model's
``transcript``). Two passes, greedy:

- ``tool_choice: "required"``: the share of replies whose calls are valid (each names an offered
  function and its arguments validate against that function's schema, ``jsonschema``), the
  target 100 %; and, told apart, the share that called the function the request was written
  for (the model's choice: the grammar makes a call valid, not apt).
- ``tool_choice: "auto"``: the share of replies that call a function, and of those how many are
  valid. Reported, not held to a target; the set is not tuned to the model.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import procs
from .figures import Section, Target, at_least

log = logging.getLogger("bench.tool_calls")

TIMEOUT = 300.0


def _object(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


STRING = {"type": "string", "minLength": 1, "maxLength": 40}
FUNCTIONS: list[dict[str, Any]] = [
    {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": _object(
            {"city": STRING, "unit": {"enum": ["celsius", "fahrenheit"]}}, ["city", "unit"]
        ),
    },
    {
        "name": "convert_currency",
        "description": "Convert an amount of money from one currency to another",
        "parameters": _object(
            {
                "amount": {"type": "number", "minimum": 0, "maximum": 1000000},
                "from": {"enum": ["USD", "EUR", "GBP", "JPY"]},
                "to": {"enum": ["USD", "EUR", "GBP", "JPY"]},
            },
            ["amount", "from", "to"],
        ),
    },
    {
        "name": "set_timer",
        "description": "Start a countdown timer",
        "parameters": _object(
            {"minutes": {"type": "integer", "minimum": 1, "maximum": 600}}, ["minutes"]
        ),
    },
    {
        "name": "send_email",
        "description": "Send an email",
        "parameters": _object(
            {
                "to": {"type": "array", "items": STRING, "minItems": 1, "maxItems": 3},
                "subject": STRING,
            },
            ["to", "subject"],
        ),
    },
    {
        "name": "book_table",
        "description": "Book a table at a restaurant",
        "parameters": _object(
            {
                "restaurant": STRING,
                "people": {"type": "integer", "minimum": 1, "maximum": 20},
                "time": {"type": "string", "pattern": "^[0-2][0-9]:[0-5][0-9]$"},
            },
            ["restaurant", "people", "time"],
        ),
    },
    {
        "name": "search_flights",
        "description": "Find flights between two airports",
        "parameters": _object(
            {
                "route": _object(
                    {"origin": STRING, "destination": STRING}, ["origin", "destination"]
                ),
                "cabin": {"enum": ["economy", "business", "first"]},
            },
            ["route", "cabin"],
        ),
    },
    {
        "name": "add_to_list",
        "description": "Add items to a shopping list",
        "parameters": _object(
            {"items": {"type": "array", "items": STRING, "minItems": 1, "maxItems": 5}},
            ["items"],
        ),
    },
    {
        "name": "translate",
        "description": "Translate a text into a language",
        "parameters": _object(
            {
                "text": {"type": "string", "maxLength": 200},
                "language": {"enum": ["French", "German", "Spanish", "Italian"]},
            },
            ["text", "language"],
        ),
    },
    {
        "name": "get_time",
        "description": "The current time",
        "parameters": _object({}, []),
    },
    {
        "name": "calculate",
        "description": "Evaluate an arithmetic expression",
        "parameters": _object({"expression": {"type": "string", "maxLength": 80}}, ["expression"]),
    },
]
REQUESTS: dict[str, list[str]] = {
    "get_weather": [
        "What's the weather like in Paris right now?",
        "Is it raining in London?",
        "How hot is it in Cairo today, in fahrenheit?",
        "Tell me the temperature in Tokyo.",
        "Should I take an umbrella in Berlin today?",
    ],
    "convert_currency": [
        "How much is 100 dollars in euros?",
        "Convert 2500 yen to pounds.",
        "What are 40 euros in US dollars?",
        "I have 75 pounds; how many euros is that?",
        "Change 1000 USD to JPY.",
    ],
    "set_timer": [
        "Set a timer for 10 minutes.",
        "Remind me in half an hour with a timer.",
        "Start a 3 minute timer for my eggs.",
        "I need a 45 minute countdown.",
        "Timer, 90 minutes please.",
    ],
    "send_email": [
        "Email Sam that the meeting moved to Friday.",
        "Send a message to ana@example.com with the subject Lunch.",
        "Write an email to my team titled Weekly update.",
        "Mail the report to bob@example.com and eve@example.com.",
        "Send an email to my landlord about the broken heater.",
    ],
    "book_table": [
        "Book a table for 4 at Luigi's at 19:30.",
        "Reserve dinner for two at The Oak tonight at 20:00.",
        "Get me a table at Sushi Ko for 6 people at 18:45.",
        "I'd like a table for one at Cafe Blue at 12:15.",
        "Can you book Chez Marie for 3 at 21:00?",
    ],
    "search_flights": [
        "Find me a flight from Boston to Denver in economy.",
        "Are there business class flights from Paris to New York?",
        "Search first class flights from Dubai to Sydney.",
        "I need an economy flight from Madrid to Rome.",
        "Look up flights from Chicago to Toronto, business.",
    ],
    "add_to_list": [
        "Add milk and eggs to my shopping list.",
        "Put bread on the list.",
        "We need apples, bananas and coffee.",
        "Add olive oil to the shopping list.",
        "Don't let me forget rice and beans.",
    ],
    "translate": [
        "Translate 'good morning' into French.",
        "How do you say 'thank you very much' in German?",
        "Put 'where is the station?' into Spanish.",
        "Translate 'I love this city' to Italian.",
        "What is 'see you tomorrow' in French?",
    ],
    "get_time": [
        "What time is it?",
        "Tell me the current time.",
        "Do you know what time it is now?",
        "Time check, please.",
        "How late is it?",
    ],
    "calculate": [
        "What is 17 times 23?",
        "Compute 1024 divided by 8.",
        "How much is 3.5 plus 4.25?",
        "Work out 99 minus 42.",
        "What's 12 squared?",
    ],
}
TOOLS: Any = [{"type": "function", "function": f} for f in FUNCTIONS]
TARGET = 1.0  # of required calls that are valid


@dataclass(frozen=True, slots=True)
class ToolsWork:
    per_function: int = 5  # requests per function (at most 5)
    tokens: int = 160  # room for a long string argument (a digit is a token each)

    @classmethod
    def quick(cls) -> ToolsWork:
        return cls(per_function=1)


def available() -> str | None:
    try:
        import jsonschema  # noqa: F401
        import openai  # noqa: F401
    except ImportError:
        return "the openai and jsonschema packages are not installed (pip install -e '.[bench]')"
    return None


def run(work: ToolsWork, logs: Path, engine: str = "batched") -> dict[str, Any]:
    logs.mkdir(parents=True, exist_ok=True)
    extra = ("--prompt-format", "auto")
    with procs.wschat(engine, logs, 8, extra, "wschat-tools") as server:
        base = server.ws_url.replace("ws://", "http://").removesuffix("/v1/chat")
        passes = {choice: asyncio.run(_pass(base, work, choice)) for choice in ("required", "auto")}
    return {"workload": dataclasses.asdict(work), "engine": engine, **summary(passes)}


async def _pass(base: str, work: ToolsWork, choice: Any) -> list[dict[str, Any]]:
    """One reply per request: what it called, whether each call is valid, what it said."""
    import openai

    rows = []
    async with openai.AsyncOpenAI(
        base_url=f"{base}/v1", api_key="bench", timeout=TIMEOUT, max_retries=0
    ) as client:
        for name, texts in REQUESTS.items():
            for text in texts[: work.per_function]:
                reply = await client.chat.completions.create(
                    model="m",
                    messages=[{"role": "user", "content": text}],
                    tools=TOOLS,
                    tool_choice=choice,
                    parallel_tool_calls=False,
                    temperature=0,
                    max_completion_tokens=work.tokens,
                )
                message = reply.choices[0].message
                calls = [
                    (c.function.name, c.function.arguments)
                    for c in message.tool_calls or []
                    if c.type == "function"
                ]
                rows.append(
                    {
                        "for": name,
                        "finish": reply.choices[0].finish_reason,
                        "calls": [
                            {"name": n, "valid": valid(n, a), "arguments": a} for n, a in calls
                        ],
                        "text": message.content,
                    }
                )
        log.info("%s: %d replies", choice, len(rows))
    return rows


def valid(name: str, arguments: str) -> bool:
    """A call to an offered function whose arguments validate against its schema."""
    import jsonschema

    schema = next((f["parameters"] for f in FUNCTIONS if f["name"] == name), None)
    if schema is None:
        return False
    try:
        jsonschema.validate(json.loads(arguments), schema)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


# -- what the passes add up to (no I/O) -------------------------------------------------------


def summary(passes: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    out: dict[str, Any] = {"passes": {}}
    for choice, rows in passes.items():
        called = [r for r in rows if r["calls"]]
        out["passes"][choice] = {
            "replies": len(rows),
            "called": len(called),
            "valid": sum(1 for r in called if all(c["valid"] for c in r["calls"])),
            "apt": sum(1 for r in called if r["calls"][0]["name"] == r["for"]),
            "rows": rows,
        }
    return out


def _share(n: int, of: int) -> float | None:
    return n / of if of else None


def targets(result: dict[str, Any]) -> list[Target]:
    required = result["passes"]["required"]
    return [
        Target.judged(
            "tool_choice required: replies whose calls are valid, of all",
            value=required["valid"],
            against=required["replies"],
            ratio=_share(required["valid"], required["replies"]),
            limit=at_least(TARGET),
            unit="n",
        )
    ]


def report(result: dict[str, Any]) -> Section:
    work = result["workload"]
    out = Section(
        [
            f"tool calls: wschat --engine {result['engine']}, embedded model, the openai SDK, "
            f"{len(FUNCTIONS)} functions offered to each of "
            f"{len(FUNCTIONS) * work['per_function']} requests, greedy"
        ],
        targets(result),
    )
    for choice, p in result["passes"].items():
        out.parts.append(
            f"  {choice}: {p['called']} of {p['replies']} replies called a function; "
            f"{p['valid']} of those valid (a listed function, arguments that match its schema); "
            f"{p['apt']} called the function the request was written for"
        )
    return out
