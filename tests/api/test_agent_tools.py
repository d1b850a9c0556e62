"""An agent framework from PyPI (``openai-agents``) runs its own tool-calling loop against the
chat completions API of a real server: its first request forces the call (``tool_choice``
``required``), it runs the tool, sends the result and ends with the model's answer."""

from __future__ import annotations

from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    Runner,
    ToolCallOutputItem,
    function_tool,
    set_tracing_disabled,
)

from tests.sessions.test_tool_loop import ANSWER, tool_engine
from tests.support import running_server

from .support import async_client

ASKED: list[str] = []


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    ASKED.append(city)
    return f"sunny in {city}"


async def test_openai_agents_runs_its_tool_loop_to_the_answer() -> None:
    set_tracing_disabled(True)
    engine = tool_engine()
    async with running_server(engine) as url, async_client(url) as client:
        agent = Agent(
            name="weather",
            instructions="Answer with the weather tool.",
            tools=[get_weather],
            model=OpenAIChatCompletionsModel(model="m", openai_client=client),
            model_settings=ModelSettings(tool_choice="required"),
        )
        result = await Runner.run(agent, "Weather in Paris?", max_turns=4)
    assert result.final_output == ANSWER
    assert ASKED == ["Paris"]
    outputs = [item.output for item in result.new_items if isinstance(item, ToolCallOutputItem)]
    assert outputs == ["sunny in Paris"]
    # the framework sent the result back as a tool message: the answer's prompt ends with it
    last = engine.decode(engine.requests[-1].prompt_ids)
    assert '{"tool_results": [{"name": "get_weather", "content": "sunny in Paris"}]}' in last
