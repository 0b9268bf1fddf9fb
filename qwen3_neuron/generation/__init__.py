"""GRPO's rollouts: `sampling` (one-turn completions on a KV cache), `kv_cache` (the eager and the
static caches, FSDP's gather once per generation), `rollout` (turns with tool calls between them,
the tool turns appended as the chat template writes them), `tool_calls` (Qwen3's <tool_call> blocks
read), `tools` (grpo.tools and grpo.environment loaded, their schemas, the calls run with a
timeout) and `tool_worker` (the process that runs a rank's tool functions)."""
