"""Token producers: the engine interface (``base``), what engines refuse or fail with
(``errors``), a session's conversation as token ids (``history``, ``formats``: no torch) and the
engines that run a transformers model in this process (``local``: all the torch)."""

from .base import (
    CancelFlag,
    Engine,
    EngineInfo,
    Finished,
    Generation,
    GenerationRequest,
    KVUsage,
    Logprob,
    Message,
    RemoteEngine,
    SamplingParams,
    TextPieces,
    TokenChoice,
    TokenPiece,
    Turn,
)
from .errors import (
    CallArgumentsInvalid,
    ContextExhausted,
    ConversationTooLong,
    EngineError,
    EngineFailed,
    EngineOverloaded,
    FeatureUnsupported,
    GenerationFailure,
    ImagesUnsupported,
    PromptTooLong,
    SchemaRefused,
    TurnRefused,
)
from .exchanges import ToolRound
from .grammar import CompiledGrammar, GrammarCompiler, GrammarMatcher, Grammars, ResponseFormat
from .history import Chat, Conversation, PreparedTurn
from .prefixes import common_prefix
from .shares import share_victim
from .tool_calls import CallReader
from .tool_grammar import held_to_tools
from .tools import CallsInvalid, FunctionCall, ToolUse, calls_text, results_text

__all__ = [
    "CallArgumentsInvalid",
    "CallReader",
    "CallsInvalid",
    "CancelFlag",
    "Chat",
    "CompiledGrammar",
    "ContextExhausted",
    "Conversation",
    "ConversationTooLong",
    "Engine",
    "EngineError",
    "EngineFailed",
    "EngineInfo",
    "EngineOverloaded",
    "FeatureUnsupported",
    "Finished",
    "FunctionCall",
    "Generation",
    "GenerationFailure",
    "GenerationRequest",
    "GrammarCompiler",
    "GrammarMatcher",
    "Grammars",
    "ImagesUnsupported",
    "KVUsage",
    "Logprob",
    "Message",
    "PreparedTurn",
    "PromptTooLong",
    "RemoteEngine",
    "ResponseFormat",
    "SamplingParams",
    "SchemaRefused",
    "TextPieces",
    "TokenChoice",
    "TokenPiece",
    "ToolRound",
    "ToolUse",
    "Turn",
    "TurnRefused",
    "calls_text",
    "common_prefix",
    "held_to_tools",
    "results_text",
    "share_victim",
]
