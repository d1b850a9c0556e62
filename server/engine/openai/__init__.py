"""Replies from an OpenAI-compatible inference server (vLLM, llama.cpp's server), behind the
engine interface: ``connect`` builds an ``OpenAIEngine``."""

from .engine import NAME, OpenAIEngine
from .startup import OpenAIEngineConfig, connect

__all__ = ["NAME", "OpenAIEngine", "OpenAIEngineConfig", "connect"]
